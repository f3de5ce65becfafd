"""sync.deleteMissing at a run's end (run.end.delete_gone), without services: which runs delete, an id scan's
pages all recorded before the delete, and a table the scan cannot read failing the run with nothing deleted."""

from __future__ import annotations

from datetime import datetime, timezone

import psycopg
import pytest

from embedjob.api import parse_spec
from embedjob_worker.core.change_window import ChangeWindow
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.run import end
from test_change_window import spec

WATERMARK = datetime(2026, 12, 5, 17, 0, tzinfo=timezone.utc)


class Tally:
    deleted_records: int | None = None

    def deleted(self, records: int) -> None:
        self.deleted_records = records


@pytest.fixture()
def calls(monkeypatch):
    """What the run's end did, in order: the scan's pages recorded, then the delete."""
    done: list = []

    class SeenIds:
        def __init__(self, engine, run):
            pass

        def read_ids(self, ids):
            done.append(("read", list(ids)))

    monkeypatch.setattr(end, "SeenIds", SeenIds)
    monkeypatch.setattr(end, "delete_missing", lambda *args: done.append(("delete",)) or 7)
    monkeypatch.setattr(end, "read_table_ids", lambda url, table: iter([["1", "2"], ["5"]]))
    return done


def finish(window: ChangeWindow | None) -> Tally:
    tally = Tally()
    parsed = parse_spec(spec(sync={"deleteMissing": True}))
    end.delete_gone(None, parsed, None, None, window, "postgresql://source/db", tally)
    return tally


def test_a_full_read_deletes_and_a_window_read_without_a_scan_does_not(calls):
    assert finish(None).deleted_records == 7
    assert finish(ChangeWindow("updated_at", None, 0, 60, why_full="first")).deleted_records == 7
    assert calls == [("delete",), ("delete",)]
    calls.clear()
    assert finish(ChangeWindow("updated_at", WATERMARK, 2, 60)).deleted_records is None
    assert calls == []


def test_an_id_scan_records_every_page_before_it_deletes(calls):
    tally = finish(ChangeWindow("updated_at", WATERMARK, 0, 60, id_scan="every run"))
    assert calls == [("read", ["1", "2"]), ("read", ["5"]), ("delete",)] and tally.deleted_records == 7


@pytest.mark.parametrize("error", [psycopg.OperationalError("server closed the connection"),
                                   ValueError("a read of table:public.docs ran past 600 s (statement_timeout)")])
def test_a_table_the_scan_cannot_read_fails_the_run_naming_it_and_deletes_nothing(calls, monkeypatch, error):
    def failing(url, table):
        yield ["1"]
        raise error

    monkeypatch.setattr(end, "read_table_ids", failing)
    with pytest.raises(JobFailed) as failed:
        finish(ChangeWindow("updated_at", WATERMARK, 0, 60, id_scan="every run"))
    assert failed.value.reason == "SourceUnreadable"
    assert "reading the ids of table:public.docs (sync.deleteMissing)" in str(failed.value) and str(error) in str(
        failed.value)
    assert ("delete",) not in calls
