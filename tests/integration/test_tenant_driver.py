"""A driver under a per-namespace database role (docs/install.md): real Ray, the real model, real PostgreSQL."""

import json

import numpy as np
import pytest
import sqlalchemy as sa

from support.corpus import corpus_lines
from support.driver_jobs import manifest, write_input
from support.sql import query
from support.tenant_roles import tenant
from support.job_models import model_as_jobs_run_it
from embedjob_worker.core.config import JobConfig
from embedjob_worker.core.records import Record
from embedjob_worker.plan.checks import classify_records
from embedjob_worker.run.job import run_job
from embedjob_worker.source.files import read_records

pytestmark = pytest.mark.slow


def test_a_driver_under_a_namespace_role_embeds_every_record_exactly_once(ray_address, database_url, tmp_path):
    team_a, team_b = tenant(database_url, "team-a"), tenant(database_url, "team-b")  # migrated by the admin
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(0, 300))
    spec = manifest(source, "tenant-job")
    spec["metadata"]["namespace"] = "team-a"
    job = JobConfig.from_manifest(spec)

    summary = run_job(job, team_a.url)

    assert summary.state == "succeeded", summary.error
    records = {r.id: r.text for r in classify_records(read_records(str(source), "jsonl", "id", "text"))
               if isinstance(r, Record)}
    assert len(records) > 250
    # The vectors table went into the role's own schema, one row per valid record.
    rows = query(database_url, f'SELECT record_id, text, embedding::text AS embedding FROM "{team_a.role}".embeddings'
                               " ORDER BY record_id")
    assert [r.record_id for r in rows] == sorted(records)
    assert all(r.text == records[r.record_id] for r in rows)
    model = model_as_jobs_run_it(job.spec.model)
    reference = model.encode([r.text for r in rows], normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(np.array([json.loads(r.embedding) for r in rows]), reference, atol=1e-5)
    assert query(database_url, "SELECT namespace, job_key, state, records_embedded FROM embedjob_runs") == [
        ("team-a", "local/team-a/tenant-job/embeddings/tenant-job", "succeeded", len(records))]
    assert query(database_url, "SELECT to_regclass('public.embeddings')")[0][0] is None
    # Another namespace's role sees neither the run nor the vectors.
    assert query(team_b.url, "SELECT count(*) FROM embedjob_runs")[0][0] == 0
    with pytest.raises(sa.exc.ProgrammingError, match=f"permission denied for schema {team_a.role}"):
        query(team_b.url, f'SELECT count(*) FROM "{team_a.role}".embeddings')
