"""Detached actor pools on a shared Ray cluster: the driver's side (real Ray head with its
dashboard and token authentication, the packaged model, PostgreSQL). The operator's pure
decisions are in tests/unit/test_pool_decisions.py."""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid

import pytest

from embedjob.contract import pool_removal_command
from embedjob_worker.pools import pool_actor_name
from support.pools import PACKAGED_MODEL, other_revision_model, sample_input, shared_job
from support.sql import query

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
