"""pytest plugin: the envtest fixtures (a real Kubernetes control plane and KubeRay).

Registered by the cluster tier's conftest (``tests/cluster/conftest.py``).

Fixtures
--------
``envtest_binaries`` (session)
    The :class:`~envtest.binaries.Binaries` alone, without starting anything.
``kube`` (session)
    etcd + kube-apiserver (built from Go modules by ``tests/envtest/setup``) on
    free loopback ports, RBAC on, TokenRequest working, KubeRay's CRDs and the
    repo's ``crds/*.yaml`` installed (server-side apply) and Established.
    ``KUBECONFIG`` points at an admin kubeconfig while the session runs.
    Returns a :class:`~envtest.control_plane.Kube`.
``namespace`` (function)
    A fresh namespace (unique name, with its ``default`` ServiceAccount), deleted
    afterwards (it stays Terminating: no namespace controller runs).
``kuberay_operator`` (session)
    The real KubeRay operator running against ``kube``; a
    :class:`~envtest.kuberay.KubeRayOperator`.
``kueue`` (session)
    Kueue's controller manager (built from its Go module) with its CRDs, running its
    RayJob integration against ``kube`` (webhooks served but not registered:
    ``envtest/kueue.py`` says why); a :class:`~envtest.kueue.Kueue`.

Tests that use ``kube``, ``namespace``, ``kuberay_operator`` or ``kueue`` get the ``k8s`` marker.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from envtest.binaries import Binaries, find_binaries
from envtest.control_plane import Kube, running_control_plane
from envtest.kuberay import KubeRayOperator, running_kuberay_operator
from envtest.kueue import Kueue, running_kueue

K8S_FIXTURES = {"kube", "namespace", "kuberay_operator", "kueue"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if K8S_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.k8s)


@pytest.fixture(scope="session")
def envtest_binaries() -> Binaries:
    """Paths of the harness binaries (built by ``tests/envtest/setup`` if missing)."""
    return find_binaries()


@pytest.fixture(scope="session")
def kube(envtest_binaries: Binaries, request: pytest.FixtureRequest) -> Iterator[Kube]:
    workdir = Path(tempfile.mkdtemp(prefix="embedjob-envtest-"))
    old_kubeconfig = os.environ.get("KUBECONFIG")
    try:
        with running_control_plane(workdir, envtest_binaries) as kube:
            os.environ["KUBECONFIG"] = kube.kubeconfig
            yield kube
    finally:
        if old_kubeconfig is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old_kubeconfig
        # logs are kept for debugging when a test failed (or EMBEDJOB_ENVTEST_KEEP=1)
        if os.environ.get("EMBEDJOB_ENVTEST_KEEP") == "1" or request.session.testsfailed:
            sys.stderr.write(f"envtest: kept {workdir} (logs, certs, kubeconfigs)\n")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _namespace_name(request: pytest.FixtureRequest) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")
    base = re.sub(r"^test-?", "", base)[:40].strip("-") or "t"
    return f"{base}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (name returned) with its ``default`` ServiceAccount."""
    name = _namespace_name(request)
    kube.kubectl("create", "namespace", name)
    kube.ensure_default_serviceaccount(name)
    try:
        yield name
    finally:
        kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture(scope="session")
def kuberay_operator(kube: Kube) -> Iterator[KubeRayOperator]:
    with running_kuberay_operator(kube) as operator:
        yield operator


@pytest.fixture(scope="session")
def kueue(kube: Kube) -> Iterator[Kueue]:
    with running_kueue(kube, kube.bin.kueue, Path(kube.bin.kueue_crds)) as running:
        yield running
