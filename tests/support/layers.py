"""The import layers of the packages: which package and driver stage may import which, checked from the source.

Every import statement counts, also one inside a function or under TYPE_CHECKING: a lazy
import is still a dependency. `python tests/support/layers.py` prints the driver's stage graph.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKER = "embedjob_worker"
#: the driver's stages, lowest first: a stage imports only the ones before it
STAGES = ("core", "source", "plan", "encode", "sink", "run")
#: the driver's entrypoints (embedjob.contract): they import stages, no stage imports them
ENTRYPOINTS = ("driver", "pools")
HEAVY_MODEL = ("torch", "sentence_transformers", "transformers", "optimum", "openvino", "nncf")
#: third-party packages a part may not import, whatever the stage order says
FORBIDDEN = {
    "embedjob": ("controller", WORKER, "embedjob_cli", "ray", "kopf", "kubernetes") + HEAVY_MODEL,
    "controller": (WORKER, "embedjob_cli", "ray") + HEAVY_MODEL,
    WORKER: ("controller", "embedjob_cli", "kopf", "kubernetes"),
    f"{WORKER}.core": ("ray",) + HEAVY_MODEL,
    f"{WORKER}.source": ("ray",) + HEAVY_MODEL,
    f"{WORKER}.plan": ("ray",) + HEAVY_MODEL,
    f"{WORKER}.sink": HEAVY_MODEL,
    f"{WORKER}.run": HEAVY_MODEL,
}
#: where each package's source lives
PACKAGE_DIRS = {"embedjob": REPO / "embedjob", "controller": REPO / "controller",
                WORKER: REPO / "worker_image" / WORKER, "embedjob_cli": REPO / "embedjob_cli"}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    imported: str  # the imported module, dotted and absolute
    path: Path
    line: int

    def __str__(self) -> str:
        where = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{where}:{self.line}: {self.module} imports {self.imported}"


def module_name(package: str, root: Path, path: Path) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(package: str, root: Path) -> list[Import]:
    """Every import statement in the package under `root`, relative ones resolved."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(package, root, path)
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [Import(module, alias.name, path, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module
                # `from pkg import sub` may import a submodule: count pkg.sub when it is one of ours
                found.append(Import(module, target, path, node.lineno))
                found += [Import(module, f"{target}.{alias.name}", path, node.lineno) for alias in node.names
                          if _is_module(f"{target}.{alias.name}")]
    return found


def _is_module(dotted: str) -> bool:
    package, _, rest = dotted.partition(".")
    root = PACKAGE_DIRS.get(package)
    if root is None or not rest:
        return False
    path = root.joinpath(*rest.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def stage_of(module: str) -> str | None:
    """The driver stage of an embedjob_worker module (`core` ... `run`), else None."""
    parts = module.split(".")
    if parts[0] != WORKER or len(parts) < 2:
        return None
    return parts[1] if parts[1] in STAGES or parts[1] in ENTRYPOINTS else None


def _forbidden_for(module: str) -> tuple[str, ...]:
    parts = module.split(".")
    return FORBIDDEN.get(parts[0], ()) + (FORBIDDEN.get(".".join(parts[:2]), ()) if len(parts) > 1 else ())


def violations(imports: list[Import]) -> list[str]:
    """What breaks the layers: a stage importing a higher one or an entrypoint, a part importing what it may not."""
    found = []
    for imp in imports:
        top = imp.imported.split(".")[0]
        if top in _forbidden_for(imp.module):
            found.append(f"{imp}: {imp.module.split('.')[0]} may not import {top}")
            continue
        source, target = stage_of(imp.module), stage_of(imp.imported)
        if source in STAGES and target in ENTRYPOINTS:
            found.append(f"{imp}: stage {source} imports the entrypoint {target}")
        elif source in STAGES and target in STAGES and STAGES.index(target) > STAGES.index(source):
            found.append(f"{imp}: stage {source} imports the higher stage {target} (order: {' < '.join(STAGES)})")
    return found


def all_imports() -> list[Import]:
    return [imp for package, root in PACKAGE_DIRS.items() for imp in imports_of(package, root)]


def stage_graph(imports: list[Import]) -> Counter:
    """(importing stage, imported stage) -> number of import statements, across stages only."""
    return Counter((stage_of(i.module), stage_of(i.imported)) for i in imports
                   if stage_of(i.module) and stage_of(i.imported) and stage_of(i.module) != stage_of(i.imported))


def describe_graph(graph: Counter) -> str:
    order = STAGES + ENTRYPOINTS
    edges = sorted(graph.items(), key=lambda item: (order.index(item[0][0]), order.index(item[0][1])))
    return "\n".join(f"{source:>7} -> {target:<7} {count}" for (source, target), count in edges)


if __name__ == "__main__":
    imports = all_imports()
    print(describe_graph(stage_graph(imports)))
    problems = violations(imports)
    print("\n".join(problems) or "no layer violations")
    sys.exit(1 if problems else 0)
