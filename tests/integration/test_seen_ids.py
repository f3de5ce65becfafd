"""Duplicate ids decided by PostgreSQL (embedjob_worker.sink.seen_ids) agree with the in-memory rule, also on resume."""

from embedjob_worker.sink.copy_data import content_salt
from embedjob_worker.core.records import RawRecord
from embedjob_worker.plan.checks import classify_records
from embedjob_worker.sink.seen_ids import SeenIds
from embedjob_worker.sink.runs import RunRequest
from embedjob_worker.sink.target import SinkTarget
from support.sink import open_job
from support.sql import query


def raw_records(count: int) -> list[RawRecord]:
    """Ids repeat far apart (across the chunks duplicates are decided in) and within a chunk."""
    ids = [f"r{i}" for i in range(count)]
    ids[2400], ids[2401], ids[17] = "r5", "r1999", "r16"
    return [RawRecord(i, record_id, None if i == 5 else f"text {i}") for i, record_id in enumerate(ids)]


def test_the_database_decides_duplicates_like_memory_and_a_resume_gets_the_same_answers(database_url):
    job = open_job(database_url, SinkTarget("local/default/seen", "c", "vectors", content_salt(True, None)), "seen",
                   "default")
    run = job.runs.start(RunRequest("m", "r", "in", "cfg"), new_run=False).run
    records = raw_records(2500)
    in_memory = list(classify_records(records))
    duplicates = {(b.position, b.record_id) for b in in_memory if getattr(b, "reason", None) == "duplicate_id"}
    # The first occurrence wins even when its text is bad (r5 at position 5 has none).
    assert duplicates == {(17, "r16"), (2400, "r5"), (2401, "r1999")}
    assert list(classify_records(records, SeenIds(job.engine, run))) == in_memory
    assert query(database_url, "SELECT count(*) FROM embedjob_seen_ids")[0][0] == 2500 - 3
    # A resumed session reads the same input again: the ids stored by the first one change nothing.
    assert list(classify_records(records, SeenIds(job.engine, run))) == in_memory
    job.runs.finish(run, "succeeded", None, None)
    assert query(database_url, "SELECT count(*) FROM embedjob_seen_ids")[0][0] == 0
    job.close()
