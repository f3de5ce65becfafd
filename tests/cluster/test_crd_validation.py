"""The EmbeddingJob CRD on the real API server: what `kubectl apply` rejects, with
messages that name the field, and the immutability of an accepted spec."""

from __future__ import annotations

import json

import pytest

from support.kubectl import condition, get_json, set_condition_on_status
from support.manifests import ej_manifest
from support.pod_settings import MALFORMED_POD_SETTINGS

pytestmark = pytest.mark.k8s

SELECTOR = {"ray.io/cluster": "shared"}
TABLE = {"name": "docs", "idColumn": "id", "textColumn": "body"}

# (case id, spec fields merged into a valid minimal spec, text the error must contain)
MALFORMED = [
    ("batch-size-zero", {"batching": {"batchSize": 0}}, "spec.batching.batchSize"),
    ("batch-size-huge", {"batching": {"batchSize": 5000}}, "spec.batching.batchSize"),
    ("sort-window-below-batch", {"batching": {"batchSize": 64, "sortWindow": 10}}, "spec.batching.sortWindow"),
    ("max-in-flight-zero", {"batching": {"maxInFlight": 0}}, "spec.batching.maxInFlight"),
    ("max-tokens-zero", {"batching": {"maxTokens": 0}}, "spec.batching.maxTokens"),
    ("max-tokens-unsorted", {"batching": {"sortWindow": 0, "maxTokens": 4096}}, "spec.batching.maxTokens"),
    ("max-tokens-batch-of-one", {"batching": {"batchSize": 1, "maxTokens": 4096}}, "spec.batching.maxTokens"),
    ("format-unknown", {"source": {"format": "xml"}}, "spec.source.format"),
    ("source-missing", {"source": None}, "spec.source"),
    ("uri-empty", {"source": {"uri": ""}}, "spec.source.uri"),
    ("model-unpinned", {"model": {"name": "m", "package": None}}, "spec.model.revision"),
    ("model-path-and-package", {"model": {"path": "/models/m"}}, "spec.model.path"),
    ("model-revision-pattern", {"model": {"revision": "a b"}}, "spec.model.revision"),
    ("max-seq-length-small", {"model": {"maxSeqLength": 4}}, "spec.model.maxSeqLength"),
    ("replicas-zero", {"workers": {"replicas": 0}}, "spec.workers.replicas"),
    ("cpus-zero", {"workers": {"cpusPerActor": 0}}, "spec.workers.cpusPerActor"),
    ("cpus-fraction-above-one", {"workers": {"cpusPerActor": 1.5}}, "spec.workers.cpusPerActor"),
    ("gpus-negative", {"workers": {"gpusPerActor": -1}}, "spec.workers.gpusPerActor"),
    ("gpus-fraction-above-one", {"workers": {"gpusPerActor": 2.5}}, "spec.workers.gpusPerActor"),
    ("memory-not-a-quantity", {"workers": {"memory": "4 gigs"}}, "spec.workers.memory"),
    ("image-with-space", {"workers": {"image": "my image"}}, "spec.workers.image"),
    ("sink-missing", {"sink": None}, "spec.sink"),
    ("secret-name-invalid", {"sink": {"databaseSecretRef": {"name": "Bad_Name"}}}, "spec.sink.databaseSecretRef.name"),
    ("secret-key-invalid", {"sink": {"databaseSecretRef": {"key": "a/b"}}}, "spec.sink.databaseSecretRef.key"),
    ("table-not-identifier", {"sink": {"table": "drop table;"}}, "spec.sink.table"),
    ("attempts-zero", {"retry": {"attemptsPerBatch": 0}}, "spec.retry.attemptsPerBatch"),
    ("backoff-limit-huge", {"retry": {"backoffLimit": 101}}, "spec.retry.backoffLimit"),
    ("deadline-zero", {"activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds"),
    ("suspend-not-bool", {"suspend": "yes"}, "spec.suspend"),
    ("selector-without-cluster", {"clusterSelector": {"team": "a"}}, "spec.clusterSelector"),
    ("selector-bad-value", {"clusterSelector": {"ray.io/cluster": "no spaces"}}, "spec.clusterSelector"),
    ("selector-and-suspend", {"clusterSelector": SELECTOR, "suspend": True}, "spec.suspend"),
    ("selector-and-backoff", {"clusterSelector": SELECTOR, "retry": {"backoffLimit": 1}}, "spec.retry.backoffLimit"),
    ("selector-and-ttl", {"clusterSelector": SELECTOR, "ttlSecondsAfterFinished": 60}, "spec.ttlSecondsAfterFinished"),
    ("unknown-field", {"sourcee": {"uri": "x"}}, "sourcee"),
    # spec.head.template and spec.workers.template (docs/pod-settings.md)
    *((case, spec, field) for case, spec, field, _ in MALFORMED_POD_SETTINGS),
    ("table-and-uri", {"source": {"table": TABLE}}, "spec.source.uri"),
    ("table-name-injection", {"source": {"uri": None, "table": {**TABLE, "name": 'docs"; DROP TABLE x; --'}}},
     "spec.source.table.name"),
    ("table-column-too-long", {"source": {"uri": None, "table": {**TABLE, "idColumn": "c" * 64}}},
     "spec.source.table.idColumn"),
    ("filter-raw-sql-op", {"source": {"uri": None, "table": {**TABLE, "filter": [
        {"column": "lang", "op": "= 'en' OR 1=1 --", "value": "x"}]}}}, "spec.source.table.filter[0].op"),
    ("filter-in-without-values", {"source": {"uri": None, "table": {**TABLE, "filter": [
        {"column": "lang", "op": "in", "value": "en"}]}}}, "spec.source.table.filter[0].values"),
    ("source-database-for-a-file", {"source": {"databaseSecretRef": {"name": "cms-db"}}},
     "spec.source.databaseSecretRef"),
    ("chunk-tokens-too-few", {"chunking": {"maxTokens": 7}}, "spec.chunking.maxTokens"),
    ("chunk-tokens-not-a-number", {"chunking": {"maxTokens": "256"}}, "spec.chunking.maxTokens"),
    ("chunk-overlap-negative", {"chunking": {"overlapTokens": -1}}, "spec.chunking.overlapTokens"),
    ("chunk-overlap-over-half", {"chunking": {"maxTokens": 128, "overlapTokens": 65}},
     "spec.chunking.overlapTokens"),
    ("chunk-over-the-model", {"model": {"maxSeqLength": 128}, "chunking": {"maxTokens": 256}},
     "spec.chunking.maxTokens"),
    ("chunk-overlap-over-the-model", {"model": {"maxSeqLength": 128}, "chunking": {"overlapTokens": 65}},
     "spec.chunking.overlapTokens"),
    ("chunk-unknown-field", {"chunking": {"strategy": "sentences"}}, "spec.chunking.strategy"),
    ("metadata-fields-empty", {"source": {"metadataFields": []}}, "spec.source.metadataFields"),
    ("metadata-field-twice", {"source": {"metadataFields": ["lang", "url", "lang"]}}, "spec.source.metadataFields"),
    ("metadata-field-with-nul", {"source": {"metadataFields": ["a\u0000b"]}}, "spec.source.metadataFields"),
    ("metadata-field-not-a-column", {"source": {"uri": None, "table": TABLE, "metadataFields": ["meta.lang"]}},
     "spec.source.metadataFields"),
    ("metadata-map-a-list", {"source": {"metadataFieldMap": ["lang"]}}, "spec.source.metadataFieldMap"),
    ("metadata-map-of-numbers", {"source": {"metadataFieldMap": {"title": 3}}}, "spec.source.metadataFieldMap.title"),
    ("metadata-map-nul", {"source": {"metadataFieldMap": {"title": "a\u0000b"}}}, "spec.source.metadataFieldMap.title"),
    ("metadata-map-key-long", {"source": {"metadataFieldMap": {"k" * 257: "title"}}},
     "a metadataFieldMap name is text of 1-256 characters"),
    ("metadata-map-key-twice", {"source": {"metadataFields": ["title"], "metadataFieldMap": {"title": "doc.title"}}},
     "a name is kept twice"),
    ("metadata-over-32-together", {"source": {"metadataFields": [f"f{n}" for n in range(20)],
                                              "metadataFieldMap": {f"k{n}": "v" for n in range(13)}}},
     "keep 32 fields at most, together"),
    ("metadata-map-not-a-column", {"source": {"uri": None, "table": TABLE, "metadataFieldMap": {"title": "meta.t"}}},
     "metadataFields are its columns"),
    ("metadata-index-without-fields", {"sink": {"index": {"metadata": True}}}, "spec.sink.index.metadata"),
    ("table-text-column-and-template", {"source": {"uri": None, "table": TABLE, "textTemplate": "{title}"}},
     "spec.source.textTemplate"),
    ("table-without-text", {"source": {"uri": None, "table": {"name": "docs", "idColumn": "id"}}},
     "spec.source.textTemplate"),
    ("change-column-injection", {"source": {"uri": None, "table": {**TABLE, "changeColumn": "at; DROP TABLE x"}}},
     "spec.source.table.changeColumn"),
    ("change-skew-without-column", {"source": {"uri": None, "table": {**TABLE, "changeSkewSeconds": 5}}},
     "spec.source.table.changeSkewSeconds"),
    ("change-skew-over-a-day", {"source": {"uri": None, "table": {**TABLE, "changeColumn": "at",
                                                                  "changeSkewSeconds": 86_401}}},
     "spec.source.table.changeSkewSeconds"),
    ("full-scans-without-change-column", {"source": {"uri": None, "table": TABLE},
                                          "sync": {"deleteMissing": True, "fullScanEvery": 3}},
     "spec.sync.fullScanEvery"),
    ("full-scans-without-delete-missing", {"source": {"uri": None, "table": {**TABLE, "changeColumn": "at"}},
                                           "sync": {"fullScanEvery": 3}}, "spec.sync.fullScanEvery"),
    ("schedule-allow", {"schedule": {"cron": "@daily", "concurrencyPolicy": "Allow"}},
     "spec.schedule.concurrencyPolicy"),
    ("schedule-zone", {"schedule": {"cron": "@daily", "timeZone": "../etc/passwd"}}, "spec.schedule.timeZone"),
    ("schedule-history", {"schedule": {"cron": "@daily", "failedRunsHistoryLimit": 101}},
     "spec.schedule.failedRunsHistoryLimit"),
    ("schedule-no-cron", {"schedule": {"timeZone": "UTC"}}, "spec.schedule.cron"),
    ("queued-suspend-without-schedule", {"queueName": "q", "suspend": True}, "spec.suspend"),
]


@pytest.mark.parametrize("spec, field", [pytest.param(s, f, id=i) for i, s, f in MALFORMED])
def test_malformed_manifest_is_rejected_naming_the_field(kube, namespace, spec, field):
    res = kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest("bad", **spec), check=False)
    assert res.returncode != 0, f"accepted: {spec}"
    assert field in res.stderr, res.stderr
    assert kube.kubectl("get", "ej", "bad", "-n", namespace, check=False).returncode != 0


def test_long_name_is_rejected(kube, namespace):
    res = kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest("x" * 64), check=False)
    assert res.returncode != 0 and "metadata.name" in res.stderr, res.stderr


def test_defaults_are_filled_by_the_api_server(kube, namespace):
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest("defaults"))
    spec = get_json(kube, "ej", "defaults", "-n", namespace)["spec"]
    # batchSize and maxTokens stay unset (no schema default), so the driver can tell a default budget is wanted
    assert spec["batching"] == {"maxInFlight": 4, "sortWindow": 4096}
    assert spec["workers"] == {"replicas": 1, "cpusPerActor": 1, "gpusPerActor": 0}
    assert spec["sink"]["databaseSecretRef"]["key"] == "url" and spec["suspend"] is False
    assert spec["retry"] == {"attemptsPerBatch": 3, "failedBatchesTolerated": 0, "backoffLimit": 0}


def test_valid_variants_are_accepted(kube, namespace):
    variants = {
        "fractional-gpu": {"workers": {"gpusPerActor": 0.25, "cpusPerActor": 0.5, "replicas": 4}},
        "whole-gpus": {"workers": {"gpusPerActor": 2, "cpusPerActor": 4, "memory": "8Gi"}},
        "on-cluster": {"clusterSelector": {"ray.io/cluster": "shared-ray"}},
        "token-budget": {"batching": {"batchSize": 512, "maxTokens": 16384}},
        "token-budget-alone": {"batching": {"maxTokens": 4096}},
        "fixed-batches": {"batching": {"batchSize": 64}},
        "chunking": {"model": {"maxSeqLength": 256}, "chunking": {"maxTokens": 256, "overlapTokens": 128}},
        "chunking-defaults": {"chunking": {}},
        "revision": {"model": {"package": None, "revision": "0123456789abcdef0123456789abcdef01234567"}},
        "table-sync": {"source": {"uri": None, "databaseSecretRef": {"name": "cms-db"}, "table": {
            **TABLE, "schema": "Sales_2026", "filter": [{"column": "lang", "op": "in", "values": ["en", "de"]},
                                                        {"column": "deleted_at", "op": "isNull"}]}},
                       "sync": {"deleteMissing": True}},
        "table-changes": {"source": {"uri": None, "table": {**TABLE, "changeColumn": "updated_at"}}},
        "metadata-fields": {"source": {"metadataFields": ["title", "meta.lang", "a field"]},
                            "sink": {"index": {"metadata": True}}},
        "metadata-map": {"source": {"metadataFields": ["url"], "metadataFieldMap": {
            "title": "doc.title", "lang": "meta.lang", "again": "doc.title"}}, "sink": {"index": {"metadata": True}}},
        "table-metadata-map": {"source": {"uri": None, "table": TABLE, "metadataFieldMap": {"Cost": "price"}}},
        "scheduled": {"schedule": {"cron": "*/15 * * * *", "timeZone": "Europe/Berlin", "startingDeadlineSeconds": 600}},
        # a schedule's suspend pauses the schedule: allowed with a queue or an existing cluster
        "scheduled-queued-suspended": {"schedule": {"cron": "@hourly"}, "queueName": "q", "suspend": True},
        "scheduled-shared-suspended": {"schedule": {"cron": "@hourly"}, "suspend": True,
                                       "clusterSelector": {"ray.io/cluster": "shared-ray"}},
        "table-changes-full-scans": {"source": {"uri": None, "table": {**TABLE, "changeColumn": "updated_at",
                                                                       "changeSkewSeconds": 0}},
                                     "sync": {"deleteMissing": True, "fullScanEvery": 24}},
    }
    for name, spec in variants.items():
        kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest(name, **spec))
    names = kube.kubectl("get", "ej", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(names) == sorted(f"embeddingjob.embedjob.dev/{n}" for n in variants)


def test_spec_is_immutable_once_accepted_except_suspend(kube, namespace):
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest("frozen"))
    # Before acceptance the spec can still be fixed.
    kube.kubectl("patch", "ej", "frozen", "-n", namespace, "--type=merge",
                 "-p", json.dumps({"spec": {"batching": {"batchSize": 32}}}))
    set_condition_on_status(kube, namespace, "frozen", "Accepted", "True", "RayJobCreated")
    assert condition(get_json(kube, "ej", "frozen", "-n", namespace), "Accepted")["status"] == "True"

    for change in ({"batching": {"batchSize": 16}}, {"source": {"uri": "other.jsonl"}},
                   {"workers": {"image": "other:1"}}, {"activeDeadlineSeconds": 60}):
        res = kube.kubectl("patch", "ej", "frozen", "-n", namespace, "--type=merge",
                           "-p", json.dumps({"spec": change}), check=False)
        assert res.returncode != 0, change
        assert "spec is immutable once the job is accepted" in res.stderr, res.stderr

    kube.kubectl("patch", "ej", "frozen", "-n", namespace, "--type=merge", "-p", '{"spec": {"suspend": true}}')
    spec = get_json(kube, "ej", "frozen", "-n", namespace)["spec"]
    assert spec["suspend"] is True and spec["batching"]["batchSize"] == 32


def test_printer_columns(kube, namespace):
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest("printed"))
    patch = {"status": {"state": "Running", "reason": "JobRunning", "progress": {"summary": "120/400 batches"}}}
    kube.kubectl("patch", "ej", "printed", "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", json.dumps(patch))
    header, row = kube.kubectl("get", "ej", "printed", "-n", namespace).stdout.splitlines()
    assert header.split() == ["NAME", "STATUS", "REASON", "PROGRESS", "AGE"]
    assert row.split()[:5] == ["printed", "Running", "JobRunning", "120/400", "batches"]
    wide = kube.kubectl("get", "ej", "printed", "-n", namespace, "-o", "wide").stdout
    assert "TEXTS/S" in wide and "REASON" in wide and "JobRunning" in wide
