"""Detached actor pools on a shared Ray cluster: the driver's side (real Ray head with its
dashboard and token authentication, the packaged model, PostgreSQL). The operator's pure
decisions are in tests/unit/test_pool_decisions.py."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
import uuid

import pytest
import sqlalchemy as sa

from controller.pool_leases import LeaseStore
from embedjob import db, schema
from embedjob.contract import pool_removal_command
from embedjob_worker.core.config import JobConfig
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.encode.lease import LEASE_LOST, PoolLease
from embedjob_worker.core.actor_names import pool_actor_name
from support.driver_crash import succeeded_attempts
from support.polling import wait_until
from support.pools import PACKAGED_MODEL, SHARED_CLUSTER, other_revision_model, sample_input, shared_job
from support.sql import query

CLUSTER = f"tests/{SHARED_CLUSTER}"

def test_the_jobs_api_refuses_calls_without_the_token(token_ray):
    for headers in ({}, {"Authorization": "Bearer not-the-token"}):
        request = urllib.request.Request(f"{token_ray.dashboard_url}/api/jobs/", method="POST",
                                         data=b'{"entrypoint": "true"}',
                                         headers={"Content-Type": "application/json", **headers})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code in (401, 403)
    # The operator's client sends the token and gets through.
    output = token_ray.client().run("echo token-accepted", f"auth-{uuid.uuid4().hex[:6]}", timeout_s=60)
    assert "token-accepted" in output


@pytest.mark.slow
def test_jobs_with_the_same_model_share_one_pool_and_another_revision_gets_its_own(token_ray, database_url,
                                                                                   tmp_path):
    source = sample_input(tmp_path, 40)
    first, second = shared_job("first", str(uuid.uuid4()), source, PACKAGED_MODEL), \
        shared_job("second", str(uuid.uuid4()), source, PACKAGED_MODEL)
    first["spec"]["sink"]["writers"] = 2  # its writes go through writer actors, next to the pool's actor
    # Started together: both get-or-create the same detached actor.
    drivers = [token_ray.driver(job, database_url, tmp_path / f"{job['metadata']['name']}.log")
               for job in (first, second)]
    for job, driver in zip((first, second), drivers):
        assert driver.wait(240) == 0, (tmp_path / f"{job['metadata']['name']}.log").read_text()[-3000:]
    other = shared_job("other", str(uuid.uuid4()), source, other_revision_model(tmp_path))
    assert token_ray.driver(other, database_url, tmp_path / "other.log").wait(240) == 0, \
        (tmp_path / "other.log").read_text()[-3000:]

    leases = query(database_url, "SELECT job_name, pool, cluster, released_at FROM embedjob_pool_leases")
    pools = {row.job_name: row.pool for row in leases}
    assert pools["first"] == pools["second"] != pools["other"]
    assert {row.cluster for row in leases} == {"tests/shared"}
    assert all(row.released_at is not None for row in leases)
    # One actor per pool ever existed (the state API lists dead ones too): the model was
    # loaded once for both jobs, and the other revision has an actor of its own.
    shared_actors = token_ray.actors(pool_actor_name(pools["first"], 0))
    other_actors = token_ray.actors(pool_actor_name(pools["other"], 0))
    assert [a["state"] for a in shared_actors] == ["ALIVE"] and [a["state"] for a in other_actors] == ["ALIVE"]
    assert shared_actors[0]["ray_namespace"] == other_actors[0]["ray_namespace"] == "embedjob"
    assert shared_actors[0]["is_detached"] and shared_actors[0]["actor_id"] != other_actors[0]["actor_id"]
    # Every batch of both jobs was embedded by that one actor.
    workers = query(database_url, "SELECT r.job_name, b.worker FROM embedjob_batches b "
                                  "JOIN embedjob_runs r USING (run_id) WHERE b.state = 'succeeded'")
    by_job: dict[str, set[str]] = {}
    for row in workers:
        by_job.setdefault(row.job_name, set()).add(row.worker.rsplit("/", 1)[1])
    assert by_job["first"] == by_job["second"] == {shared_actors[0]["actor_id"][:8]}
    assert by_job["other"] == {other_actors[0]["actor_id"][:8]}
    revisions = query(database_url, "SELECT DISTINCT collection, revision FROM embeddings")
    assert len({r.revision for r in revisions}) == 2 and len(revisions) == 3

    # The operator's removal entrypoint, run on the cluster through the Jobs API, kills a
    # pool's actors (and gives the session's cluster its CPUs back).
    for pool in (pools["first"], pools["other"]):
        output = token_ray.client().run(pool_removal_command(pool), f"remove-{uuid.uuid4().hex[:6]}", timeout_s=120)
        assert pool_actor_name(pool, 0) in output
        assert [a["state"] for a in token_ray.actors(pool_actor_name(pool, 0))] == ["DEAD"]


def lease_for_test(database_url: str, tmp_path, **timing: float) -> PoolLease:
    schema.migrate(database_url)
    config = JobConfig.from_manifest(shared_job("leased", str(uuid.uuid4()), sample_input(tmp_path, 1), PACKAGED_MODEL))
    return PoolLease.acquire(db.create_engine(database_url), "pool-test", CLUSTER, config, 1, **timing)


def test_a_lease_whose_pool_the_operator_removed_is_lost_and_confirms_no_new_actor(database_url, tmp_path):
    lease = lease_for_test(database_url, tmp_path, interval_s=0.2)
    lease.confirm()  # live: renewed
    store = LeaseStore(database_url)
    with store.locked(CLUSTER, "pool-test") as pool:  # the operator's removal, as PoolSweeper does it
        _, leases = pool.leases()
        pool.mark_removed(leases)
    store.close()
    with pytest.raises(JobFailed, match="the operator removed the pool") as lost:
        lease.confirm()
    assert lost.value.reason == LEASE_LOST
    # The heartbeat no longer renews a lease whose pool is gone.
    before = query(database_url, "SELECT heartbeat_at FROM embedjob_pool_leases")
    time.sleep(1)
    assert query(database_url, "SELECT heartbeat_at FROM embedjob_pool_leases") == before
    lease.release()


def test_a_lease_whose_heartbeat_cannot_get_through_for_its_lifetime_is_lost(database_url, tmp_path):
    lease = lease_for_test(database_url, tmp_path, interval_s=0.2, lifetime_s=2.0)
    lease.check()
    engine = db.create_engine(database_url)
    # Another session holds the pool's lock (a removal in progress): renewals wait for it.
    with engine.connect() as blocker:
        blocker.execute(db.advisory_lock_sql("pg_advisory_lock", db.POOL_LOCK),
                        {"name": db.pool_lock_name(CLUSTER, "pool-test")})
        blocker.commit()
        time.sleep(0.5)
        lease.check()  # within its lifetime
        lost = wait_until("the lease to be lost", lambda: _lost(lease), timeout=10, interval=0.2)
        assert lost.reason == LEASE_LOST and "no heartbeat got through" in str(lost)
        blocker.execute(db.advisory_lock_sql("pg_advisory_unlock", db.POOL_LOCK),
                        {"name": db.pool_lock_name(CLUSTER, "pool-test")})
        blocker.commit()
    lease.release()
    engine.dispose()


def _lost(lease: PoolLease) -> JobFailed | None:
    try:
        lease.check()
    except JobFailed as lost:
        return lost
    return None


@pytest.mark.slow
def test_a_job_whose_pool_is_removed_mid_run_stops_with_lease_lost_and_a_rerun_completes_it_exactly_once(
        token_ray, database_url, tmp_path):
    max_in_flight = 2
    source = sample_input(tmp_path, 400)
    job = shared_job("removed-midrun", str(uuid.uuid4()), source, PACKAGED_MODEL)
    log_path = tmp_path / "first.log"
    driver = token_ray.driver(job, database_url, log_path)
    try:
        wait_until("3 committed batches", lambda: driver.poll() is not None or _committed(database_url) >= 3,
                   timeout=240)
        assert driver.poll() is None, log_path.read_text()[-3000:]
        (pool,) = {row.pool for row in query(database_url, "SELECT pool FROM embedjob_pool_leases")}
        # The operator's removal while the job runs: the pool's lock, its actors killed, the lease marked.
        store = LeaseStore(database_url)
        with store.locked(CLUSTER, pool) as locked:
            _, leases = locked.leases()
            token_ray.client().run(pool_removal_command(pool), f"remove-{uuid.uuid4().hex[:6]}", timeout_s=120)
            locked.mark_removed(leases)
        store.close()
        assert driver.wait(120) == 1, log_path.read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
    run = query(database_url, "SELECT state, reason, error FROM embedjob_runs")
    assert [(r.state, r.reason) for r in run] == [("failed", LEASE_LOST)], run
    assert "the operator removed the pool" in run[0].error
    # No actor was created after the removal: the pool's actors are all dead.
    assert {a["state"] for a in token_ray.actors(pool_actor_name(pool, 0))} == {"DEAD"}
    committed = _committed_ids(database_url)
    dispatched = set(re.findall(r"event=batch_dispatched batch=(\w+)", log_path.read_text()))
    assert 3 <= len(committed) and committed <= dispatched
    assert len(dispatched - committed) <= max_in_flight  # the work the removal lost
    stored = query(database_url, "SELECT count(*), count(DISTINCT record_id) FROM embeddings")[0]
    records_committed = query(database_url, "SELECT sum(records) FROM embedjob_batches WHERE state = 'succeeded'")
    assert stored[0] == stored[1] == records_committed[0][0]

    # Run again: a new lease, a new pool generation, the committed batches skipped.
    assert token_ray.driver(job, database_url, tmp_path / "second.log").wait(300) == 0, \
        (tmp_path / "second.log").read_text()[-3000:]
    leases = query(database_url, "SELECT released_at, pool_removed_at FROM embedjob_pool_leases ORDER BY acquired_at")
    assert [(r.released_at is not None, r.pool_removed_at is not None) for r in leases] == [(True, True), (True, False)]
    assert query(database_url, "SELECT count(*), count(DISTINCT record_id) FROM embeddings")[0] == (400, 400)
    ids = {r.record_id for r in query(database_url, "SELECT record_id FROM embeddings")}
    assert ids == {json.loads(line)["id"] for line in source.read_text().splitlines()}
    attempts = succeeded_attempts(database_url)
    assert len(attempts) == 50 and set(attempts.values()) == {1}
    assert query(database_url, "SELECT state FROM embedjob_runs") == [("succeeded",)]
    token_ray.client().run(pool_removal_command(pool), f"remove-{uuid.uuid4().hex[:6]}", timeout_s=120)


def _committed(url: str) -> int:
    try:
        return query(url, "SELECT count(*) FROM embedjob_batches WHERE state = 'succeeded'")[0][0]
    except sa.exc.ProgrammingError:  # not migrated yet
        return 0


def _committed_ids(url: str) -> set[str]:
    return {r.batch_id for r in query(url, "SELECT batch_id FROM embedjob_batches WHERE state = 'succeeded'")}
