"""The PostgreSQL sink against a real PostgreSQL with pgvector (no Ray, no model)."""

import logging
import numpy as np
import psycopg
import pytest
import sqlalchemy as sa

from support.sql import query
from embedjob_worker.sink.copy_data import content_salt
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.outcome import AttemptRow, BatchOutcome, now
from embedjob_worker.core.records import BadReason, BadRecord, Record, Span
from embedjob_worker.sink.postgres import open_engine
from embedjob_worker.sink.runs import RunRequest
from embedjob_worker.sink.target import SinkTarget, VectorsTable
from embedjob_worker.sink.vectors_table import ensure_vectors_table
from support.sink import OpenJob, open_job

DIM = 4
RUN = RunRequest("m", "r1", "in", "cfg")


def make_sink(url: str, table: str = "vectors") -> OpenJob:
    return open_job(url, SinkTarget("local/default/sinktest", "c1", table, content_salt(True, None)), "sinktest",
                    "default", dim=DIM)


def outcome(batch_id: str, texts: dict[str, str], seed: int = 0) -> BatchOutcome:
    records = tuple(Record(i, rid, text) for i, (rid, text) in enumerate(texts.items()))
    vectors = np.random.default_rng(seed).standard_normal((len(records), DIM)).astype(np.float32)
    return BatchOutcome(batch_id, "succeeded", records, [AttemptRow(1, "w", "succeeded", None, now())], now(),
                        vectors=vectors, worker="w", duration_s=0.1)


def test_batches_are_written_with_their_marks_and_rewrites_change_nothing(database_url):
    job = make_sink(database_url)
    run = job.runs.start(RUN, new_run=False).run
    first = outcome("b1", {"a": "alpha", "b": "beta"})
    job.sink.write(run, [first, outcome("b2", {"c": "gamma"})], [BadRecord(7, "x", BadReason.null_text)])
    vectors = query(database_url, "SELECT record_id, embedding::text, updated_at FROM vectors ORDER BY record_id")
    assert [r.record_id for r in vectors] == ["a", "b", "c"]
    # The binary COPY carried the exact float32 values.
    assert np.allclose(np.array(eval(vectors[0].embedding)), first.vectors[0])
    assert query(database_url, "SELECT batch_id, state, records FROM embedjob_batches ORDER BY 1") == [
        ("b1", "succeeded", 2), ("b2", "succeeded", 1)]
    assert query(database_url, "SELECT reason FROM embedjob_record_errors") == [("null_text",)]

    assert query(database_url, "SELECT records_embedded, batches_succeeded FROM embedjob_runs") == [(3, 2)]

    # A re-run of the same batch (the run resumed: its counters start afresh): no new rows, unchanged rows
    # keep updated_at.
    resumed = job.runs.start(RUN, new_run=False).run
    job.sink.write(resumed, [outcome("b1", {"a": "alpha", "b": "beta CHANGED"}, seed=1)], [])
    again = query(database_url, "SELECT record_id, updated_at FROM vectors ORDER BY record_id")
    assert len(again) == 3
    assert again[0].updated_at == vectors[0].updated_at  # "a": same text, not rewritten
    assert again[1].updated_at > vectors[1].updated_at  # "b": text changed, rewritten
    assert query(database_url, "SELECT count(*) FROM embedjob_batch_attempts WHERE batch_id = 'b1'") == [(2,)]
    assert query(database_url, "SELECT records_embedded FROM embedjob_runs") == [(2,)]
    job.close()


def test_records_new_when_planned_are_copied_in_and_one_written_since_is_merged(database_url, caplog):
    """A group of records the planner found nowhere in the table (records_new) is copied straight into it.
    When one of them is there after all (another job wrote it since), the COPY is undone and the merge
    writes the group: the record's text and vector are replaced, and its chunks past its last go."""
    job = make_sink(database_url)
    run = job.runs.start(RUN, new_run=False).run
    spans = (Span(0, 5, 3), Span(6, 10, 3), Span(11, 16, 3))
    three = BatchOutcome("b1", "succeeded", (Record(0, "a", "alpha beta gamma", spans),),
                         [AttemptRow(1, "w", "succeeded", None, now())], now(),
                         vectors=np.ones((3, DIM), dtype=np.float32), worker="w", records_new=1)
    rows = lambda: query(database_url, "SELECT record_id, chunk, text FROM vectors ORDER BY 1, 2")  # noqa: E731
    with caplog.at_level(logging.INFO, logger="embedjob_worker.sink.postgres"):
        job.sink.write(run, [three], [])
        assert rows() == [("a", 0, "alpha"), ("a", 1, "beta"), ("a", 2, "gamma")]
        assert not [r for r in caplog.records if r.msg == "new_records_already_written"]

        written_since = outcome("b2", {"b": "beta", "a": "alpha!"})
        written_since.records_new = 2  # "a" was not there when the planner looked
        job.sink.write(run, [written_since], [])
    assert rows() == [("a", 0, "alpha!"), ("b", 0, "beta")]
    assert [r.fields["batches"] for r in caplog.records if r.msg == "new_records_already_written"] == [1]
    assert query(database_url, "SELECT batch_id, state FROM embedjob_batches ORDER BY 1") == [
        ("b1", "succeeded"), ("b2", "succeeded")]
    assert query(database_url, "SELECT records_embedded, records_new FROM embedjob_runs") == [(3, 3)]
    job.close()


def test_an_outcome_sent_twice_is_written_once_and_another_session_writes_nothing(database_url):
    """A group sent again after its writer actor was lost (its commit may have landed), and a
    writer of a driver whose run another driver resumed since."""
    job = make_sink(database_url)
    run = job.runs.start(RUN, new_run=False).run
    sent = outcome("b1", {"a": "alpha", "b": "beta"})
    assert [o.batch_id for o in job.sink.write(run, [sent], [])] == ["b1"]
    assert job.sink.write(run, [sent, outcome("b2", {"c": "gamma"})], []) != []
    assert query(database_url, "SELECT batch_id, count(*) FROM embedjob_batch_attempts GROUP BY 1 ORDER BY 1") == [
        ("b1", 1), ("b2", 1)]
    assert query(database_url, "SELECT batches_succeeded, records_embedded FROM embedjob_runs") == [(2, 3)]

    job.runs.start(RUN, new_run=False)  # another driver resumes: `run` is a session that no longer owns it
    with pytest.raises(JobFailed) as superseded:
        job.sink.write(run, [outcome("b3", {"d": "delta"})], [])
    assert superseded.value.reason == "DriverSuperseded"
    assert query(database_url, "SELECT count(*) FROM embedjob_batches WHERE batch_id = 'b3'") == [(0,)]
    assert query(database_url, "SELECT count(*) FROM vectors WHERE record_id = 'd'") == [(0,)]
    job.close()


def test_a_failing_group_writes_neither_vectors_nor_marks(database_url):
    job = make_sink(database_url)
    run = job.runs.start(RUN, new_run=False).run
    bad = outcome("b2", {"c": "gamma"})
    bad.vectors = np.zeros((1, DIM + 1), dtype=np.float32)  # wrong width: the merge fails
    with pytest.raises(psycopg.errors.DataException):
        job.sink.write(run, [outcome("b1", {"a": "alpha"}), bad], [])
    assert query(database_url, "SELECT count(*) FROM vectors") == [(0,)]
    assert query(database_url, "SELECT count(*) FROM embedjob_batches") == [(0,)]
    job.close()


def test_runs_resume_refuse_a_changed_input_and_start_anew_when_told(database_url):
    job = make_sink(database_url)
    changed = RunRequest("m", "r1", "in-2", "cfg")
    first = job.runs.start(RunRequest("m", "r1", "in-1", "cfg"), new_run=False)
    assert not first.resumed
    again = job.runs.start(RunRequest("m", "r1", "in-1", "cfg"), new_run=False)
    assert (again.run.run_id, again.resumed) == (first.run.run_id, True)
    assert again.run.driver_session != first.run.driver_session
    with pytest.raises(JobFailed, match="input changed") as refused:
        job.runs.start(changed, new_run=False)
    assert refused.value.reason == "InputChanged"
    # Refusing again compares with the real run, not with the refusal.
    with pytest.raises(JobFailed):
        job.runs.start(changed, new_run=False)
    second = job.runs.start(changed, new_run=True)
    assert second.run.run_id != first.run.run_id and not second.resumed
    states = query(database_url, "SELECT state, reason FROM embedjob_runs ORDER BY started_at, reason NULLS LAST")
    assert sorted(states, key=str) == sorted([("running", None), ("failed", "InputChanged"),
                                              ("failed", "InputChanged"), ("running", None)], key=str)
    job.close()


def test_vectors_table_of_another_width_is_refused(database_url):
    make_sink(database_url).close()
    engine = open_engine(database_url)
    with pytest.raises(JobFailed, match=r"vector\(4\)"):
        ensure_vectors_table(engine, VectorsTable("public", "vectors"), DIM * 2, "vector")
    engine.dispose()



def test_drivers_starting_together_create_the_vectors_table_once(database_url):
    """Two jobs writing one table may start at the same moment."""
    import threading

    make_sink(database_url, table="bootstrap").close()  # migrations done once, as a first driver would
    engines = [open_engine(database_url) for _ in range(6)]  # a driver's each
    start, errors = threading.Barrier(len(engines)), []

    def create(engine):
        start.wait()
        try:
            ensure_vectors_table(engine, VectorsTable("public", "shared"), DIM, "vector")
        except Exception as exc:  # collected: the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for engine in engines:
        engine.dispose()
    assert errors == []
    assert query(database_url, "SELECT count(*) FROM pg_class WHERE relname = 'shared'") == [(1,)]


def test_a_connection_dropped_mid_write_is_retried_and_writes_each_row_once(database_url):
    """PostgreSQL ends the writing session in the middle of a batch's transaction (a
    trigger terminates its own backend, once: sequences ignore rollbacks)."""
    from embedjob_worker.core.tally import RunTally
    from embedjob_worker.sink.writer import SinkWriter

    job = make_sink(database_url)
    run = job.runs.start(RUN, new_run=False).run
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SEQUENCE drop_once"))
        conn.execute(sa.text("""
            CREATE FUNCTION drop_connection_once() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF nextval('drop_once') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
              RETURN NEW;
            END $$"""))
        conn.execute(sa.text("CREATE TRIGGER drop_connection BEFORE INSERT ON embedjob_batches "
                             "FOR EACH ROW EXECUTE FUNCTION drop_connection_once()"))
    engine.dispose()

    writer = SinkWriter(job.sink, run, RunTally())
    writer.put_outcome(outcome("b1", {"a": "alpha", "b": "beta"}))
    writer.close()
    job.close()

    assert writer.error is None
    assert query(database_url, "SELECT record_id FROM vectors ORDER BY 1") == [("a",), ("b",)]
    assert query(database_url, "SELECT state FROM embedjob_batches") == [("succeeded",)]
    attempts = query(database_url, "SELECT outcome, reason FROM embedjob_batch_attempts ORDER BY id")
    assert [a.outcome for a in attempts] == ["retry", "succeeded"]
    assert attempts[0].reason.startswith("DatabaseWriteFailed")
