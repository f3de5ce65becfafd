"""spec.sink.index and spec.sink.vectorType on the real API server: `kubectl apply` refuses what pgvector
would refuse, naming the field, and fills the defaults (no index, vector)."""

from __future__ import annotations

import pytest

from support.kubectl import get_json
from support.manifests import ej_manifest

pytestmark = pytest.mark.k8s

MALFORMED = [
    ("m-below-2", {"index": {"type": "hnsw", "m": 1}}, "spec.sink.index.m"),
    ("m-above-100", {"index": {"type": "hnsw", "m": 101}}, "spec.sink.index.m"),
    ("m-not-a-number", {"index": {"type": "hnsw", "m": "16) WITH (x"}}, "spec.sink.index.m"),
    ("ef-above-1000", {"index": {"type": "hnsw", "efConstruction": 1001}}, "spec.sink.index.efConstruction"),
    ("ef-below-2m", {"index": {"type": "hnsw", "m": 40}}, "efConstruction must be at least 2 * m"),
    ("m-without-hnsw", {"index": {"m": 16}}, "m, efConstruction and buildMemory apply to type hnsw only"),
    ("memory-without-hnsw", {"index": {"buildMemory": "1Gi"}}, "apply to type hnsw only"),
    ("memory-below-1Mi", {"index": {"type": "hnsw", "buildMemory": "1023Ki"}}, "between 1Mi and 2047Gi"),
    ("memory-above-2047Gi", {"index": {"type": "hnsw", "buildMemory": "2Ti"}}, "between 1Mi and 2047Gi"),
    ("memory-postgres-units", {"index": {"type": "hnsw", "buildMemory": "1GB"}}, "spec.sink.index.buildMemory"),
    ("memory-injection", {"index": {"type": "hnsw", "buildMemory": "1Gi'; SET x = '1"}},
     "spec.sink.index.buildMemory"),
    ("type-unknown", {"index": {"type": "ivfflat"}}, "spec.sink.index.type"),
    ("vector-type-unknown", {"vectorType": "float8"}, "spec.sink.vectorType"),
]


@pytest.mark.parametrize("sink, message", [pytest.param(s, m, id=i) for i, s, m in MALFORMED])
def test_hostile_index_values_are_refused_at_apply_naming_the_field(kube, namespace, sink, message):
    res = kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest("bad", sink=sink), check=False)
    assert res.returncode != 0, f"accepted: {sink}"
    assert message in res.stderr, res.stderr


def test_defaults_and_valid_variants(kube, namespace):
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest("plain"))
    sink = get_json(kube, "ej", "plain", "-n", namespace)["spec"]["sink"]
    # An optional object gets no CRD default (embedjob.crd): no index stored, which means none.
    assert "index" not in sink and sink["vectorType"] == "vector"
    for name, variant in {"hnsw": {"index": {"type": "hnsw"}, "vectorType": "halfvec"},
                          "edges": {"index": {"type": "hnsw", "m": 2, "efConstruction": 4}},
                          "top": {"index": {"type": "hnsw", "m": 100, "efConstruction": 1000,
                                            "buildMemory": "2047Gi"}},
                          "memory": {"index": {"type": "hnsw", "buildMemory": "1Mi"}}}.items():
        kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest(name, sink=variant))
    stored = get_json(kube, "ej", "hnsw", "-n", namespace)["spec"]["sink"]
    assert stored["index"] == {"type": "hnsw"} and stored["vectorType"] == "halfvec"
