"""The packages' import layers: the driver's stages import only lower stages, each part only what it may."""

from pathlib import Path

from support import layers
from support.paths import REPO

MAX_MODULE_LINES = 300


def test_no_import_runs_against_the_layers():
    imports = layers.all_imports()
    graph = layers.describe_graph(layers.stage_graph(imports))
    assert layers.violations(imports) == [], f"stage graph (importer -> imported, statements):\n{graph}"


def test_a_planted_wrong_way_import_is_caught(tmp_path: Path):
    # a copy of two stages in which plan imports the sink, and core imports the driver's entrypoint and ray
    (tmp_path / "plan").mkdir()
    (tmp_path / "core").mkdir()
    (tmp_path / "plan" / "feed.py").write_text("from embedjob_worker.sink.postgres import PostgresSink\n")
    (tmp_path / "core" / "logs.py").write_text("def f():\n    import ray\n    from .. import driver\n")
    found = layers.violations(layers.imports_of(layers.WORKER, tmp_path))
    assert len(found) == 3, found
    for expected in ("stage plan imports the higher stage sink", "embedjob_worker may not import ray",
                     "stage core imports the entrypoint driver"):
        assert any(expected in problem for problem in found), (expected, found)


def test_every_stage_is_a_folder_that_states_its_rule():
    root = REPO / "worker_image" / layers.WORKER
    for stage in layers.STAGES:
        init = root / stage / "__init__.py"
        assert init.is_file(), f"stage {stage} has no folder"
        docstring = init.read_text().split('"""')[1]
        assert docstring.startswith(f"Stage `{stage}`") and "mport" in docstring, docstring
    assert {p.name for p in root.iterdir() if p.is_file() and p.suffix == ".py"} == {
        "__init__.py", *(f"{name}.py" for name in layers.ENTRYPOINTS)}


def test_no_module_is_longer_than_the_house_limit():
    long = [f"{path.relative_to(REPO)}: {lines}" for root in layers.PACKAGE_DIRS.values()
            for path in root.rglob("*.py") if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert long == [], f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"


def test_every_module_says_what_it_holds_in_its_first_docstring_line():
    missing = [str(path.relative_to(REPO)) for root in layers.PACKAGE_DIRS.values() for path in root.rglob("*.py")
               if path.stat().st_size and not path.read_text().lstrip().startswith(('"""', "# "))]
    assert missing == []


def test_outside_the_api_package_the_spec_model_is_imported_from_its_facade():
    behind = [str(imp) for imp in layers.all_imports() if not imp.module.startswith("embedjob.")
              and imp.imported.startswith("embedjob.api_") and imp.imported != "embedjob.api_status"]
    assert behind == [], "import these from embedjob.api (its __all__)"
