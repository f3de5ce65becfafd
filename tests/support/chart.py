"""The Helm chart through the real helm: rendering, installing, reading the rendered objects."""

from __future__ import annotations

import subprocess
import tempfile

import yaml

from envtest.binaries import find_binaries
from support.paths import CHART

RELEASE = "embedjob-operator"
RELEASE_NAMESPACE = "embedjob-system"
# The values files of this process, removed when it exits (each had been left in the temp folder: 196 of them).
_VALUES_DIR = tempfile.TemporaryDirectory(prefix="embedjob-values-")


def helm(*args: str, check: bool = True, kubeconfig: str | None = None) -> subprocess.CompletedProcess:
    cmd = [find_binaries().helm, *args]
    if kubeconfig:
        cmd.append(f"--kubeconfig={kubeconfig}")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stderr}{res.stdout}")
    return res


def values_args(values: dict | None) -> list[str]:
    """``--values FILE`` for a values dict (the file lives until the process exits)."""
    if not values:
        return []
    file = tempfile.NamedTemporaryFile("w", dir=_VALUES_DIR.name, suffix=".yaml", delete=False)
    with file:
        yaml.safe_dump(values, file)
    return ["--values", file.name]


def render_chart(values: dict | None = None, namespace: str = RELEASE_NAMESPACE, hooks: bool = False) -> list[dict]:
    """The objects ``helm template`` renders (CRDs excluded; hooks, such as the uninstall hook, only with ``hooks``)."""
    no_hooks = [] if hooks else ["--no-hooks"]
    out = helm("template", RELEASE, str(CHART), "--namespace", namespace, *no_hooks, *values_args(values)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def the(objects: list[dict], kind: str) -> dict:
    (obj,) = by_kind(objects, kind)
    return obj


def container_env(objects: list[dict]) -> dict[str, dict]:
    (container,) = the(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in container["env"]}


def assert_refused(res: subprocess.CompletedProcess, message: str) -> None:
    """helm refused the values with a schema error that contains `message`."""
    assert res.returncode != 0, f"{res.args} succeeded"
    assert "values don't meet the specifications of the schema" in res.stderr, res.stderr
    assert message in res.stderr, res.stderr
