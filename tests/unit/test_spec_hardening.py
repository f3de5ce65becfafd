"""Spec values the old schema accepted that cannot work: `parse_spec` refuses them naming the field,
and a driver run that embedded nothing is Failed/NothingEmbedded, not Complete."""

import pytest

from controller import status
from controller.rayjob import worker_layout
from controller.run_reader import RunRow
from embedjob import api, api_rules, db
from support.manifests import MINIMAL_SPEC, merged

REFUSED = [
    ({"workers": {"cpusPerActor": 0.0004}}, "spec.workers.cpusPerActor"),
    ({"workers": {"cpusPerActor": 0.0015}}, "spec.workers.cpusPerActor"),
    ({"workers": {"replicas": 1024, "gpusPerActor": 0.001}}, "spec.workers.gpusPerActor"),
    ({"workers": {"gpusPerActor": 1.5}}, "spec.workers.gpusPerActor"),
    ({"clusterSelector": {"ray.io/cluster": ""}}, "spec.clusterSelector"),
    *(({"sink": {"table": table}}, "spec.sink.table")
      for table in ("embedjob_runs", "embedjob_batches", "embedjob_batch_attempts", "embedjob_record_errors",
                    "embedjob_pool_leases", "alembic_version", "embedjob_anything")),
    *(({"sink": {"collection": blank}}, "spec.sink.collection") for blank in (" ", " docs", "docs ", "\t")),
    *(({"model": {"package": None, "path": root}}, "spec.model.path")
      for root in ("/", "//", "/usr", "/etc/", "/home", ".", "..", "~")),
    ({"retry": {"failedBatchesToleratedPercent": 101}}, "spec.retry.failedBatchesToleratedPercent"),
]


@pytest.mark.parametrize("patch, field", REFUSED)
def test_unworkable_values_are_refused_naming_the_field(patch, field):
    with pytest.raises(api.SpecError) as err:
        api.parse_spec(merged(MINIMAL_SPEC, patch))
    assert field in str(err.value)


@pytest.mark.parametrize("patch", [
    {"workers": {"cpusPerActor": 0.001}}, {"workers": {"cpusPerActor": 0.007}}, {"workers": {"cpusPerActor": 0.25}},
    {"workers": {"gpusPerActor": 0.0625, "replicas": 32}}, {"workers": {"gpusPerActor": 0.3}},
    {"sink": {"table": "embeddings_v2", "collection": "pep docs"}},
    {"model": {"package": None, "path": "/home/ray/models/minilm"}},
    {"model": {"package": None, "path": "models/minilm"}},
    {"retry": {"failedBatchesToleratedPercent": 2.5}},
])
def test_workable_neighbours_are_accepted(patch):
    api.parse_spec(merged(MINIMAL_SPEC, patch))


def test_every_bookkeeping_table_is_reserved():
    vectors_tables = {name for name in db.metadata.tables if not api_rules.TABLE_RULE.allows(name)}
    assert vectors_tables == set(db.metadata.tables)


def test_a_fractional_gpu_packs_at_most_sixteen_actors_a_pod():
    spec = api.parse_spec(merged(MINIMAL_SPEC, {"workers": {"replicas": 1024, "gpusPerActor": 0.0625}}))
    layout = worker_layout(spec.workers)
    assert (layout.pods, layout.actors_per_pod, layout.gpus_per_pod) == (64, 16, 1)


@pytest.mark.parametrize("count, percent, batches, allowed", [
    (0, None, 1000, 0), (3, None, 1000, 3), (0, 2.5, 1000, 25), (30, 2.5, 1000, 30), (0, 50, 1, 0),
])
def test_failed_batches_allowed_is_the_larger_of_count_and_share(count, percent, batches, allowed):
    retry = api.Retry(failed_batches_tolerated=count, failed_batches_tolerated_percent=percent)
    assert retry.failed_batches_allowed(batches) == allowed


def _finished(records_total: int, records_embedded: int) -> dict:
    run = RunRow(state="succeeded", batches_total=2, batches_succeeded=0, batches_failed=2,
                 records_total=records_total, records_embedded=records_embedded, records_failed=records_total)
    rayjob = {"metadata": {"name": "ej-x-1234abcd"}, "spec": {},
              "status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}}
    obs = status.Observation(generation=1, suspend=False, verdict=None, rayjob=rayjob, run=run,
                             progress_error=None, now="2026-01-01T00:00:00Z")
    return status.desired_status({}, obs)


def test_a_run_that_embedded_nothing_is_failed():
    st = _finished(records_total=128, records_embedded=0)
    assert (st["state"], st["reason"]) == ("Failed", "NothingEmbedded")
    assert "none of the 128 records" in next(c for c in st["conditions"] if c["type"] == "Failed")["message"]


def test_an_empty_input_still_completes():
    assert _finished(records_total=0, records_embedded=0)["state"] == "Complete"
