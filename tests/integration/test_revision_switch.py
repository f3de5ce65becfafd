"""A collection switched to another revision (here: another document prompt, so other vectors) through the table's
`_current` view: readers see the old revision until the new one's run has written every batch, then only the new one;
retired revisions past spec.sink.retainPrevious go with their vectors, and a later run of one embeds it afresh."""

import threading

import sqlalchemy as sa

from support.corpus import corpus_lines
from support.driver_jobs import manifest, write_input
from support.sql import query
from embedjob_cli.search import revision_refusal
from embedjob.db import runs
from embedjob.schema import migrate
from embedjob_worker.core.config import JobConfig
from embedjob_worker.run.job import DriverOptions, run_job
from embedjob_worker.sink.revisions import drop_retired, make_ready, mark_embedding
from embedjob_worker.sink.target import VectorsTable
from embedjob_worker.sink.vectors_table import ensure_vectors_table

RECORDS = 160
TABLE = VectorsTable("public", "embeddings")


def config(source, prompt: str, retain: int = 1) -> JobConfig:
    job = manifest(source, "switch", batch_size=16, max_in_flight=2)
    job["spec"]["model"]["prompt"] = {"text": prompt}
    job["spec"]["sink"]["retainPrevious"] = retain
    return JobConfig.from_manifest(job)


def run(job: JobConfig, database_url: str):
    summary = run_job(job, database_url, DriverOptions(new_run=True))
    assert summary.state == "succeeded", summary.error
    return summary


def states(database_url: str) -> dict[str, str]:
    return dict(query(database_url, "SELECT revision, state FROM embedjob_revisions WHERE collection = 'switch'"))


def rows_by_revision(database_url: str) -> dict[str, int]:
    return dict(query(database_url, "SELECT revision, count(*) FROM embeddings WHERE collection = 'switch'"
                                    " GROUP BY revision"))


class ViewReader(threading.Thread):
    """Reads the view in a loop, as a search would (a count per revision, and nearest neighbours), until stopped."""

    def __init__(self, database_url: str):
        super().__init__(daemon=True)
        self.engine = sa.create_engine(database_url)
        self.seen: list[tuple[tuple[str, ...], int, tuple[str, ...]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with self.engine.connect() as conn:
            probe = conn.execute(sa.text("SELECT embedding::text FROM embeddings_current WHERE collection = 'switch'"
                                         " LIMIT 1")).scalar_one()
            while not self.stop.is_set():  # one statement: one snapshot, as one search reads
                revisions, count, nearest = conn.execute(sa.text(
                    "WITH c AS (SELECT revision, count(*) AS n FROM embeddings_current WHERE collection = 'switch'"
                    " GROUP BY revision), k AS (SELECT DISTINCT revision FROM (SELECT revision FROM embeddings_current"
                    " WHERE collection = 'switch' ORDER BY embedding <=> CAST(:q AS vector) LIMIT 10) n)"
                    " SELECT (SELECT array_agg(revision ORDER BY revision) FROM c), (SELECT sum(n) FROM c),"
                    " (SELECT array_agg(revision ORDER BY revision) FROM k)"), {"q": probe}).one()
                conn.commit()
                self.seen.append((tuple(revisions or ()), int(count or 0), tuple(nearest or ())))
        self.engine.dispose()


def test_readers_see_the_old_revision_until_the_new_one_is_whole_then_only_the_new_one(
        ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(0, RECORDS))
    old = run(config(source, "passage: "), database_url)
    [old_revision] = rows_by_revision(database_url)
    assert states(database_url) == {old_revision: "ready"}
    whole = old.counters.records_embedded

    reader = ViewReader(database_url)
    reader.start()
    try:
        new = run(config(source, "document: "), database_url)
    finally:
        reader.stop.set()
        reader.join(30)
    new_revision = (rows_by_revision(database_url).keys() - {old_revision}).pop()
    assert new.counters.records_embedded == whole

    # every read saw one whole revision: the old one, then (from the switch's commit on) the new one
    assert reader.seen, "the reader read nothing"
    odd = [seen for seen in reader.seen if not (len(seen[0]) == 1 and seen[1] == whole and seen[2] == seen[0])]
    assert not odd, odd[:5]
    order = [revisions[0] for revisions, _, _ in reader.seen]
    switched = order.index(new_revision) if new_revision in order else len(order)
    assert set(order[:switched]) == {old_revision} and set(order[switched:]) <= {new_revision}, order
    assert switched > 0  # the reader read while the new revision was being written
    assert query(database_url, "SELECT DISTINCT revision FROM embeddings_current WHERE collection = 'switch'") == \
        [(new_revision,)]
    assert states(database_url) == {old_revision: "retired", new_revision: "ready"}
    assert rows_by_revision(database_url) == {old_revision: whole, new_revision: whole}  # retainPrevious 1 keeps it

    # `embedjob search` reads the ready revision only, and says which it is
    with sa.create_engine(database_url).connect() as conn:
        model = "sentence-transformers/all-MiniLM-L6-v2"
        assert revision_refusal(conn, TABLE, "switch", model, new_revision) is None
        refusal = revision_refusal(conn, TABLE, "switch", model, old_revision)
        assert f"is {model}@{new_revision}, not this manifest's {model}@{old_revision} (retired)" in refusal
        assert revision_refusal(conn, TABLE, "never-run", model, old_revision) is None  # nothing recorded: as before


def test_retired_revisions_past_retain_previous_go_and_a_later_run_of_one_embeds_it_again(
        ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(300, RECORDS))
    first = run(config(source, "passage: "), database_url)
    whole = first.counters.records_embedded
    [first_revision] = rows_by_revision(database_url)
    run(config(source, "document: "), database_url)
    [second_revision] = rows_by_revision(database_url).keys() - {first_revision}
    run(config(source, "text: "), database_url)  # the third switch: the first revision is past retainPrevious 1
    [third_revision] = rows_by_revision(database_url).keys() - {first_revision, second_revision}
    assert states(database_url) == {second_revision: "retired", third_revision: "ready"}
    assert rows_by_revision(database_url) == {second_revision: whole, third_revision: whole}

    # its batch rows went with its vectors: running it again embeds every record, none is skipped as done
    again = run(config(source, "passage: ", retain=0), database_url)
    assert again.batches_skipped == 0 and again.counters.records_embedded == whole
    # retainPrevious 0: every retired revision goes right after the switch
    assert states(database_url) == {first_revision: "ready"}
    assert rows_by_revision(database_url) == {first_revision: whole}
    assert query(database_url, "SELECT count(*) FROM embeddings_current WHERE collection = 'switch'") == [(whole,)]


def test_a_revision_retired_while_its_run_wrote_stays_retired_and_a_live_runs_revision_is_not_dropped(
        database_url):
    migrate(database_url)
    engine = sa.create_engine(database_url)
    table = VectorsTable("public", "vectors")
    ensure_vectors_table(engine, table, 3, "vector")
    key = dict(table=table, collection="c", model="m")
    with engine.begin() as conn:
        for revision in ("a", "b"):
            mark_embedding(conn, **key, revision=revision, namespace="tests", run_id=f"run-{revision}")
        make_ready(conn, **key, revision="a", namespace="tests", run_id="run-a")
        make_ready(conn, **key, revision="b", namespace="tests", run_id="run-b")  # a retired, as by another job
        make_ready(conn, **key, revision="a", namespace="tests", run_id="run-a")  # a's run ends after that
    assert dict(query(database_url, "SELECT revision, state FROM embedjob_revisions")) == {"a": "retired",
                                                                                          "b": "ready"}
    with engine.begin() as conn:  # a run of `a` is still writing it: its heartbeat is fresh
        conn.execute(runs.insert().values(
            run_id="run-a", job_key="k", job_name="j", namespace="tests", collection="c", vectors_table="vectors",
            model="m", revision="a", input_fingerprint="i", config_fingerprint="c", state="running",
            heartbeat_at=sa.func.now()))
        conn.execute(sa.text("INSERT INTO vectors (collection, record_id, chunk, model, revision, content_hash,"
                             " embedding, text, char_start, char_end, job_key, batch_id, updated_at) VALUES"
                             " ('c', 'r1', 0, 'm', 'a', 'h', '[1,0,0]', 't', 0, 1, 'k', 'b1', now() - interval '1h')"))
    assert drop_retired(engine, table, "c", retain=0) == []
    assert query(database_url, "SELECT count(*) FROM vectors") == [(1,)]
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE embedjob_runs SET state = 'succeeded'"))
    assert drop_retired(engine, table, "c", retain=0) == [("m", "a")]
    assert query(database_url, "SELECT count(*) FROM vectors") == [(0,)]
    assert dict(query(database_url, "SELECT revision, state FROM embedjob_revisions")) == {"b": "ready"}
    engine.dispose()
