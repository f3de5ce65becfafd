"""A dataset's listing kept in PostgreSQL (sink.listings): the files back as listed, the changes named, one listing kept."""

import json

import pytest
import sqlalchemy as sa

from embedjob import db
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.sink import listings
from embedjob_worker.sink.copy_data import content_salt
from embedjob_worker.sink.listings import StoredListing, forget_listings, listing_changes
from embedjob_worker.sink.runs import RunRequest
from embedjob_worker.sink.target import SinkTarget
from embedjob_worker.source import dataset_listing
from embedjob_worker.source.dataset import dataset_snapshot

from support.sink import open_job

TARGET = SinkTarget("local/default/listings", "c", "vectors", content_salt(True, None))


@pytest.fixture
def job(database_url):
    opened = open_job(database_url, TARGET, "listings", "default")
    yield opened
    with opened.engine.begin() as conn:
        forget_listings(conn, TARGET.job_key, set())
    opened.close()


def write_parts(folder, names, text="x"):
    for name in names:
        (folder / name).write_text(json.dumps({"id": name, "text": text}) + "\n")


def stored(job, uri):
    return dataset_snapshot(uri, "jsonl", StoredListing(job.engine, TARGET.job_key, "default"))


def test_a_stored_listing_gives_back_the_files_as_listed_a_window_at_a_time(job, tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_listing, "LISTING_PAGE", 4)
    monkeypatch.setattr(listings, "WINDOW", 3)
    write_parts(tmp_path, [f"part-{n:02d}-ü'\".jsonl" for n in range(11)])
    in_memory, kept = dataset_snapshot(f"{tmp_path}/", "jsonl"), stored(job, f"{tmp_path}/")
    assert kept.fingerprint == in_memory.fingerprint and kept.size == in_memory.size
    assert len(kept.files) == 11 and list(kept.files) == list(in_memory.files)
    assert kept.files[10] == in_memory.files[10] and kept.files[2] == in_memory.files[2]  # back and forth
    assert kept.record()["listing"] == kept.listing_id
    with job.engine.connect() as conn:  # written a page at a time, as listed
        positions = conn.execute(sa.select(db.listed_files.c.position).where(
            db.listed_files.c.listing_id == kept.listing_id).order_by(db.listed_files.c.position)).scalars().all()
    assert positions == list(range(11))


def test_the_changes_between_two_listings_are_named_and_a_forgotten_one_names_none(job, tmp_path):
    write_parts(tmp_path, ["a.jsonl", "b.jsonl", "c.jsonl"])
    before = stored(job, f"{tmp_path}/")
    write_parts(tmp_path, ["b.jsonl"], text="other bytes")
    (tmp_path / "c.jsonl").unlink()
    write_parts(tmp_path, [f"new-{n}.jsonl" for n in range(7)])
    after = stored(job, f"{tmp_path}/")
    with job.engine.begin() as conn:
        assert listing_changes(conn, before.listing_id, after.listing_id) == (
            "changed: b.jsonl; gone: c.jsonl; new: new-0.jsonl, new-1.jsonl, new-2.jsonl, new-3.jsonl, new-4.jsonl "
            "and 2 more")
        forget_listings(conn, TARGET.job_key, {after.listing_id})
        assert listing_changes(conn, before.listing_id, after.listing_id) == ""
        assert conn.execute(sa.select(sa.func.count()).select_from(db.listed_files)
                            .where(db.listed_files.c.job_key == TARGET.job_key)).scalar_one() == 9


def _request(snapshot) -> RunRequest:
    return RunRequest("m", "r", snapshot.fingerprint, "config", input_record=snapshot.record())


def _kept_listings(job) -> set[str]:
    with job.engine.connect() as conn:
        return set(conn.execute(sa.select(db.listed_files.c.listing_id).distinct()
                                .where(db.listed_files.c.job_key == TARGET.job_key)).scalars())


def test_each_start_keeps_the_listing_of_the_latest_started_run_alone(job, tmp_path):
    write_parts(tmp_path, ["a.jsonl", "b.jsonl"])
    first = stored(job, f"{tmp_path}/")
    started = job.runs.start(_request(first), new_run=False)
    assert _kept_listings(job) == {first.listing_id}

    again = stored(job, f"{tmp_path}/")  # a resumed session reads the files it listed itself
    resumed = job.runs.start(_request(again), new_run=False)
    assert resumed.resumed and resumed.run.run_id == started.run.run_id
    assert _kept_listings(job) == {first.listing_id, again.listing_id}  # the run row names the first
    latest = stored(job, f"{tmp_path}/")
    assert job.runs.start(_request(latest), new_run=False).resumed
    assert _kept_listings(job) == {first.listing_id, latest.listing_id}

    write_parts(tmp_path, ["b.jsonl"], text="other bytes")
    changed = stored(job, f"{tmp_path}/")
    with pytest.raises(JobFailed, match=r"\(files changed: b\.jsonl\) since run"):
        job.runs.start(_request(changed), new_run=False)
    assert _kept_listings(job) == {first.listing_id}  # the next start is compared with the run's: the rest go

    anew = stored(job, f"{tmp_path}/")
    assert not job.runs.start(_request(anew), new_run=True).resumed
    assert _kept_listings(job) == {anew.listing_id}
    with pytest.raises(JobFailed, match="another driver session of the job started since") as superseded:
        again.files[1]  # the session of `again`, still reading, finds its listing gone
    assert superseded.value.reason == "DriverSuperseded"


def test_a_start_refused_after_its_listing_leaves_only_the_latest_runs(job, tmp_path):
    write_parts(tmp_path, ["a.jsonl"])
    first = stored(job, f"{tmp_path}/")
    job.runs.start(_request(first), new_run=False)
    stored(job, f"{tmp_path}/")  # listed, then the start refused (e.g. a store failing on a later page)
    job.runs.refuse_start("m", JobFailed("SourceUnavailable", "spec.source: the store went away"))
    assert _kept_listings(job) == {first.listing_id}
