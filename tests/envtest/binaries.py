"""The harness binaries: the pins of versions.env and the paths that `setup` builds or finds.

Paths come from the ``EMBEDJOB_*`` variables that ``setup`` prints when they are all set;
otherwise ``setup`` runs here (it builds what is missing). With ``EMBEDJOB_ENVTEST_SKIP=1``
and binaries missing, the caller is skipped instead.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.paths import REPO

HERE = Path(__file__).resolve().parent
SETUP = HERE / "setup"
VERSIONS_ENV = HERE / "versions.env"

#: attribute name on :class:`Binaries` -> environment variable printed by setup
BINARY_ENV = {
    "etcd": "EMBEDJOB_ETCD",
    "kube_apiserver": "EMBEDJOB_KUBE_APISERVER",
    "helm": "EMBEDJOB_HELM",
    "ray_operator": "EMBEDJOB_RAY_OPERATOR",
    "kueue": "EMBEDJOB_KUEUE",
    "kubectl": "EMBEDJOB_KUBECTL",
    "prometheus": "EMBEDJOB_PROMETHEUS",
    "promtool": "EMBEDJOB_PROMTOOL",
}
CRDS_ENV = "EMBEDJOB_KUBERAY_CRDS"
KUEUE_CRDS_ENV = "EMBEDJOB_KUEUE_CRDS"
SKIP_ENV = "EMBEDJOB_ENVTEST_SKIP"


def read_versions() -> dict[str, str]:
    """The pins of versions.env (KUBERNETES_VERSION, ETCD_VERSION, HELM_VERSION, KUBERAY_VERSION, ...)."""
    versions = {}
    for line in VERSIONS_ENV.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            versions[key.strip()] = value.strip()
    return versions


@dataclass(frozen=True)
class Binaries:
    """Paths of the harness binaries; attribute or item access (``bin.helm``, ``bin["helm"]``)."""

    etcd: str
    kube_apiserver: str
    helm: str
    ray_operator: str
    kubectl: str
    kuberay_crds: str
    kueue: str
    kueue_crds: str
    prometheus: str
    promtool: str

    def __getitem__(self, name: str) -> str:
        return getattr(self, name.replace("-", "_"))

    def as_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


def _binaries_from_env(env) -> Binaries | None:
    values = {attr: env.get(var, "") for attr, var in BINARY_ENV.items()}
    values["kuberay_crds"] = env.get(CRDS_ENV, "")
    values["kueue_crds"] = env.get(KUEUE_CRDS_ENV, "")
    if all(values.values()) and all(os.access(values[a], os.X_OK) for a in BINARY_ENV) \
            and Path(values["kuberay_crds"]).is_dir() and Path(values["kueue_crds"]).is_dir():
        return Binaries(**values)
    return None


def find_binaries() -> Binaries:
    """The harness binaries: from the environment, else built by ``setup``."""
    found = _binaries_from_env(os.environ)
    if found:
        return found
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"envtest binaries missing and {SKIP_ENV}=1; build them with: eval \"$({SETUP.relative_to(REPO)})\"")
    started = time.monotonic()
    res = subprocess.run([str(SETUP)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{SETUP} failed ({res.returncode}):\n{res.stderr[-4000:]}")
    exported = {}
    for line in res.stdout.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, value = words[1].split("=", 1)
            exported[key] = value
    os.environ.update(exported)  # helpers run by tests (helm, ...) see them too
    found = _binaries_from_env(exported)
    if not found:
        raise RuntimeError(f"{SETUP} did not print usable paths:\n{res.stdout}\n{res.stderr[-2000:]}")
    sys.stderr.write(f"envtest: setup took {time.monotonic() - started:.1f}s\n")
    return found
