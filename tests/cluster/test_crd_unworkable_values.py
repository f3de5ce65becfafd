"""Spec values that cannot work, rejected by the real API server at `kubectl apply` with the field named,
while their workable neighbours are accepted."""

from __future__ import annotations

import pytest

from support.manifests import ej_manifest

pytestmark = pytest.mark.k8s

PACKAGE_OFF = {"package": None}
REFUSED = [
    ("cpu-rounds-to-zero", {"workers": {"cpusPerActor": 0.0004}}, "spec.workers.cpusPerActor"),
    ("cpu-below-millicore-step", {"workers": {"cpusPerActor": 0.0015}}, "spec.workers.cpusPerActor"),
    ("thousand-actors-a-gpu", {"workers": {"replicas": 1024, "gpusPerActor": 0.001}}, "spec.workers.gpusPerActor"),
    ("selector-empty-value", {"clusterSelector": {"ray.io/cluster": ""}}, "spec.clusterSelector"),
    ("table-runs", {"sink": {"table": "embedjob_runs"}}, "spec.sink.table"),
    ("table-prefix", {"sink": {"table": "embedjob_pool_leases"}}, "spec.sink.table"),
    ("table-alembic", {"sink": {"table": "alembic_version"}}, "spec.sink.table"),
    ("collection-blank", {"sink": {"collection": " "}}, "spec.sink.collection"),
    ("collection-padded", {"sink": {"collection": "docs "}}, "spec.sink.collection"),
    ("model-path-root", {"model": {**PACKAGE_OFF, "path": "/"}}, "spec.model.path"),
    ("model-path-usr", {"model": {**PACKAGE_OFF, "path": "/usr/"}}, "spec.model.path"),
    ("model-path-dot", {"model": {**PACKAGE_OFF, "path": "."}}, "spec.model.path"),
    ("tolerated-percent-above-100", {"retry": {"failedBatchesToleratedPercent": 150}},
     "spec.retry.failedBatchesToleratedPercent"),
]


@pytest.mark.parametrize("spec, field", [pytest.param(s, f, id=i) for i, s, f in REFUSED])
def test_unworkable_value_is_rejected_naming_the_field(kube, namespace, spec, field):
    res = kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest("bad", **spec), check=False)
    assert res.returncode != 0, f"accepted: {spec}"
    assert field in res.stderr, res.stderr


def test_workable_neighbours_are_accepted(kube, namespace):
    variants = {
        "one-millicore": {"workers": {"cpusPerActor": 0.001}},
        "seven-millicores": {"workers": {"cpusPerActor": 0.007}},
        "sixteen-a-gpu": {"workers": {"replicas": 1024, "gpusPerActor": 0.0625}},
        "own-table": {"sink": {"table": "embeddings_v2", "collection": "pep docs"}},
        "model-dir": {"model": {**PACKAGE_OFF, "path": "/home/ray/models/minilm"}},
        "tolerated-percent": {"retry": {"failedBatchesToleratedPercent": 2.5}},
    }
    for name, spec in variants.items():
        kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest(name, **spec))
    names = kube.kubectl("get", "ej", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(names) == sorted(f"embeddingjob.embedjob.dev/{n}" for n in variants)
