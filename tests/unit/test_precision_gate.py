"""The quality gate of a reduced precision (spec.model.minCosine): its sample, its verdict, its figures in the run row,
and the int8 export's choice of what stays in float32."""

import onnx
import pytest
from onnx import TensorProto, helper

from embedjob import api
from embedjob.api_model import DEFAULT_MIN_COSINE
from embedjob_worker.core.records import Record
from embedjob_worker.core.tally import RunTally
from embedjob_worker.core.worker_reports import PrecisionCheck
from embedjob_worker.encode.onnx_export import down_projections
from embedjob_worker.encode.precision import first_texts, verdict
from embedjob_worker.plan.batching import Batch


def batches(sizes):
    position = 0
    for number, size in enumerate(sizes):
        records = tuple(Record(position + i, f"r{position + i}", f"text {position + i}") for i in range(size))
        position += size
        yield Batch(f"b{number}", records)


def test_the_sample_is_the_first_texts_and_every_batch_still_follows_in_order():
    texts, again = first_texts(batches([3, 3, 3, 3]), 5)
    assert texts == [f"text {i}" for i in range(5)]
    assert [b.batch_id for b in again] == ["b0", "b1", "b2", "b3"]  # the two looked at, then the rest


def test_a_short_input_gives_what_it_has():
    texts, again = first_texts(batches([2]), 256)
    assert texts == ["text 0", "text 1"] and [b.batch_id for b in again] == ["b0"]
    assert first_texts(iter(()), 256)[0] == []


def test_the_verdict_refuses_below_the_minimum_naming_both_figures_and_the_field():
    assert verdict(PrecisionCheck(256, 0.9958, 0.9841), "int8", DEFAULT_MIN_COSINE) is None
    assert verdict(PrecisionCheck(256, 0.99, 0.5), "int8", 0.99) is None  # the mean is what is gated
    refused = verdict(PrecisionCheck(256, 0.9812, 0.9304), "int8", 0.99)
    assert refused.reason == "PrecisionBelowMinimum"
    assert str(refused).startswith("spec.model.minCosine 0.99: precision int8 gave a mean cosine of 0.9812 "
                                   "(least 0.9304) to float32 over the job's first 256 texts")
    assert verdict(PrecisionCheck(256, 0.2, -0.1), "int8", 0.0) is None  # 0 measures and never refuses


def test_the_figures_reach_the_run_row_and_the_counters():
    tally = RunTally()
    assert tally.driver_update().set["precision_cosine_mean"] is None  # float32: unset
    tally.precision_checked(PrecisionCheck(256, 0.9958, 0.9841))
    update = tally.driver_update().set
    assert (update["precision_cosine_mean"], update["precision_cosine_min"]) == (0.9958, 0.9841)
    counters = tally.counters()
    assert (counters.precision_cosine_mean, counters.precision_cosine_min) == (0.9958, 0.9841)
    assert counters.model_dump(by_alias=True)["precisionCosineMean"] == 0.9958  # as status.progress shows it


def test_min_cosine_defaults_and_is_in_the_crd():
    from embedjob import crd

    spec = api.parse_spec({"source": {"uri": "x.jsonl"}, "model": {"name": "m", "package": "p"},
                           "sink": {"databaseSecretRef": {"name": "db"}}})
    assert spec.model.min_cosine == DEFAULT_MIN_COSINE
    schema = crd.render()
    assert "minCosine" in schema and "precisionCosineMean" in schema


def matmul_graph(weights: dict[str, tuple[int, int]]) -> onnx.GraphProto:
    """A chain of MatMuls, one per weight, each named after its weight."""
    nodes, previous = [], "x"
    for name in weights:
        nodes.append(helper.make_node("MatMul", [previous, name], [f"{name}_out"], name=name))
        previous = f"{name}_out"
    initializers = [helper.make_tensor(name, TensorProto.FLOAT, dims, [0.0] * (dims[0] * dims[1]))
                    for name, dims in weights.items()]
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                             [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [1, 4])], initializers)


@pytest.mark.parametrize("weights, kept", [
    ({"query": (4, 4), "up": (4, 16), "down": (16, 4)}, ["down"]),
    ({"query": (4, 4), "up": (4, 16)}, []),
])
def test_only_the_products_back_down_from_a_wider_layer_stay_in_float(weights, kept):
    assert down_projections(matmul_graph(weights)) == kept
