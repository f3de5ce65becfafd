"""Token budgets by default: the batching a spec gets when batchSize or maxTokens is unset, the CRD that leaves
them unset, the run identity, `embedjob render` and the `--max-tokens` flag."""

from __future__ import annotations

import copy

import pytest
import yaml

from embedjob import api
from embedjob.api_batching import (
    DEFAULT_BUDGET_RECORDS, DEFAULT_CPU_MAX_TOKENS, DEFAULT_FIXED_BATCH_SIZE, DEFAULT_GPU_MAX_TOKENS, Batching,
    ChosenBatching,
)
from embedjob.crd import spec_as_stored
from embedjob.manifest import load_manifest
from embedjob_worker.core.config import JobConfig, run_identity
from support.cli import EMBEDJOB, run
from support.crd_schema import root_schema
from support.paths import REPO

CLUSTER_EXAMPLE = REPO / "examples" / "quickstart-cluster.yaml"
SPEC = {"source": {"uri": "/data/in.jsonl"}, "model": {"name": "sentence-transformers/all-MiniLM-L6-v2"},
        "sink": {"databaseSecretRef": {"name": "db"}}}


def spec(batching: dict | None = None, gpus: float | None = None) -> api.EmbeddingJobSpec:
    workers = {} if gpus is None else {"workers": {"gpusPerActor": gpus}}
    return api.parse_spec({**SPEC, **({"batching": batching} if batching is not None else {}), **workers})


@pytest.mark.parametrize(("batching", "gpus", "chosen"), [
    (None, None, ChosenBatching(DEFAULT_BUDGET_RECORDS, DEFAULT_CPU_MAX_TOKENS, "default with a budget",
                                "default for CPU")),
    ({}, 0, ChosenBatching(DEFAULT_BUDGET_RECORDS, DEFAULT_CPU_MAX_TOKENS, "default with a budget",
                           "default for CPU")),
    ({}, 1, ChosenBatching(DEFAULT_BUDGET_RECORDS, DEFAULT_GPU_MAX_TOKENS, "default with a budget",
                           "default for GPU")),
    ({}, 0.25, ChosenBatching(DEFAULT_BUDGET_RECORDS, DEFAULT_GPU_MAX_TOKENS, "default with a budget",
                              "default for GPU")),
    # batchSize alone: fixed batches, as before budgets were the default (on a GPU too)
    ({"batchSize": 64}, None, ChosenBatching(64, None, None, None)),
    ({"batchSize": 256}, 1, ChosenBatching(256, None, None, None)),
    ({"maxTokens": 2048}, None, ChosenBatching(DEFAULT_BUDGET_RECORDS, 2048, "default with a budget", None)),
    ({"maxTokens": 2048}, 1, ChosenBatching(DEFAULT_BUDGET_RECORDS, 2048, "default with a budget", None)),
    ({"maxTokens": 2048, "batchSize": 100}, None, ChosenBatching(100, 2048, None, None)),
    # no budget without length sorting: today's fixed default
    ({"sortWindow": 0}, None, ChosenBatching(DEFAULT_FIXED_BATCH_SIZE, None, "default with sortWindow 0", None)),
    ({"sortWindow": 0, "batchSize": 8}, None, ChosenBatching(8, None, None, None)),
    # a batch never outgrows its window
    ({"sortWindow": 100}, None, ChosenBatching(100, DEFAULT_CPU_MAX_TOKENS, "default with a budget",
                                               "default for CPU")),
])
def test_the_batching_chosen_for_a_spec(batching, gpus, chosen):
    assert spec(batching, gpus).chosen_batching == chosen


def test_the_choice_reads_as_render_and_the_summary_show_it():
    assert str(spec().chosen_batching) == (f"maxTokens {DEFAULT_CPU_MAX_TOKENS} (default for CPU), at most "
                                           f"{DEFAULT_BUDGET_RECORDS} records a batch (default with a budget)")
    assert str(spec({}, 1).chosen_batching).startswith(f"maxTokens {DEFAULT_GPU_MAX_TOKENS} (default for GPU)")
    assert str(spec({"batchSize": 32}).chosen_batching) == "fixed batches of 32 records"
    assert str(spec({"batchSize": 32, "maxTokens": 4096}).chosen_batching) == \
        "maxTokens 4096, at most 32 records a batch"


def test_the_crd_gives_batch_size_and_max_tokens_no_default_so_unset_survives_the_api_server():
    batching = root_schema()["properties"]["spec"]["properties"]["batching"]
    assert "default" not in batching["properties"]["batchSize"]
    assert "default" not in batching["properties"]["maxTokens"]
    # every rule on them holds for an unset field (the API server checks `default: {}` too)
    for rule in batching["x-kubernetes-validations"]:
        assert "!has(self.batchSize)" in rule["rule"] or "!has(self.maxTokens)" in rule["rule"]
    assert f"{DEFAULT_CPU_MAX_TOKENS} on CPU workers" in batching["properties"]["maxTokens"]["description"]


@pytest.mark.parametrize(("batching", "fixed"), [({}, False), ({"batchSize": 64}, True), ({"sortWindow": 0}, True)])
def test_the_spec_as_stored_chooses_as_the_spec_as_written(batching, fixed):
    written = {**SPEC, "batching": batching}
    stored = api.parse_spec(spec_as_stored(written))
    assert stored.chosen_batching == api.parse_spec(written).chosen_batching
    assert (stored.chosen_batching.max_tokens is None) == fixed


def test_the_run_identity_holds_the_chosen_batching():
    defaulted = run_identity(spec(), "rev")
    assert (defaulted["batching.batchSize"], defaulted["batching.maxTokens"]) == (DEFAULT_BUDGET_RECORDS,
                                                                                  DEFAULT_CPU_MAX_TOKENS)
    assert run_identity(spec({}, 1), "rev")["batching.maxTokens"] == DEFAULT_GPU_MAX_TOKENS
    # batchSize alone: the identity (and batch ids) of a job from before budgets were the default
    fixed = run_identity(spec({"batchSize": 64}), "rev")
    assert fixed["batching.batchSize"] == 64 and "batching.maxTokens" not in fixed


def test_the_max_tokens_flag_overrides_the_default_and_keeps_a_set_batch_size():
    def config(batching: dict) -> JobConfig:
        return JobConfig.from_manifest({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "j"},
                                        "spec": {**SPEC, "batching": batching}})

    assert config({}).with_max_tokens(1024).spec.chosen_batching == ChosenBatching(
        DEFAULT_BUDGET_RECORDS, 1024, "default with a budget", None)
    assert config({"batchSize": 32}).with_max_tokens(1024).spec.chosen_batching == ChosenBatching(32, 1024, None, None)


def test_the_batching_model_keeps_its_python_checks_with_unset_fields():
    assert Batching().batch_size is None and Batching().max_tokens is None
    with pytest.raises(ValueError, match="only meaningful with length sorting"):
        Batching(max_tokens=1024, sort_window=0)


def test_render_shows_the_chosen_batching(tmp_path):
    manifest = load_manifest(CLUSTER_EXAMPLE)
    defaulted = copy.deepcopy(manifest)
    defaulted["spec"].pop("batching", None)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(defaulted))
    rendered = run([*EMBEDJOB, "render", str(path)], timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    first, second, _ = rendered.stdout.split("\n", 2)
    assert first == f"# spec.batching: {api.parse_spec(defaulted['spec']).chosen_batching}"
    assert second == f"# spec.model.prompt: {api.parse_spec(defaulted['spec']).model.prompt_choice}"
    assert "(default for CPU)" in first
    assert yaml.safe_load(rendered.stdout)["kind"] == "RayJob"  # still the RayJob to apply
