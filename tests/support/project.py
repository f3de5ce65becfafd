"""The project's own metadata: pyproject.toml and the Ray version it pins."""

import tomllib

from packaging.requirements import Requirement

from support.paths import REPO


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def pinned_ray_version() -> str:
    """The version of `ray[default]==X` in the `worker` extra."""
    for spec in pyproject()["project"]["optional-dependencies"]["worker"]:
        req = Requirement(spec)
        if req.name == "ray":
            (pin,) = req.specifier
            assert pin.operator == "==", f"ray must be pinned exactly in the worker extra, got {spec!r}"
            return pin.version
    raise AssertionError("the worker extra does not require ray")
