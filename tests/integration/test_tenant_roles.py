"""One database role per namespace (migration 0005, `python -m embedjob.tenants`) on a real PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy.dialects.postgresql import insert as pg_insert

from controller.run_reader import RunReader
from embedjob import db, schema, tenants
from embedjob_worker.core.config import JobConfig
from embedjob_worker.sink.copy_data import content_salt
from embedjob_worker.run.job import run_job
from embedjob_worker.sink.postgres import open_engine
from embedjob_worker.sink.runs import JobRuns, RunRequest
from embedjob_worker.sink.target import SinkTarget
from support.corpus import corpus_lines
from support.driver_jobs import manifest, write_input
from support.tenant_roles import Tenant, as_role, create_role, tenant

RLS_REFUSED = "new row violates row-level security policy"
B_JOB = SinkTarget("uid-b", "c", "embeddings", content_salt(True, None))  # team-b's job
B_RUN = RunRequest("m", "r", "i" * 64, "c" * 64)
INSUFFICIENT_PRIVILEGE = "42501"


@pytest.fixture
def tenant_a(database_url) -> Tenant:
    return tenant(database_url, "team-a")


@pytest.fixture
def tenant_b(database_url) -> Tenant:
    return tenant(database_url, "team-b")


def _run(namespace: str, job_key: str, **values) -> dict:
    return {"run_id": str(uuid.uuid4()), "job_key": job_key, "job_name": "pep", "namespace": namespace,
            "collection": "c", "vectors_table": "embeddings", "model": "m", "revision": "r",
            "input_fingerprint": "i", "config_fingerprint": "c", "state": "running", **values}


def _rows_of_job(run: dict, n: int) -> dict[sa.Table, dict]:
    """One row per bookkeeping table for the job of `run` (n keeps keys apart)."""
    key, run_id = run["job_key"], run["run_id"]
    return {
        db.runs: _run(run["namespace"], key) if n else run,
        db.batches: {"job_key": key, "batch_id": f"batch-{n}", "run_id": run_id, "state": "succeeded", "records": 3},
        db.batch_attempts: {"job_key": key, "batch_id": f"batch-{n}", "run_id": run_id, "attempt": 1,
                            "outcome": "succeeded"},
        db.record_errors: {"run_id": run_id, "position": n, "job_key": key, "reason": "EmptyText"},
        db.seen_ids: {"run_id": run_id, "record_id": f"rec-{n}", "position": n},
        db.run_shards: {"run_id": run_id, "first_file": n, "files": 1, "records": 3, "batches": 1, "counts": {},
                        "batch_ids": [f"batch-{n}"]},
        db.revisions: {"vectors_table": f"{run['namespace']}.embeddings", "collection": f"c-{n}", "model": "m",
                       "revision": "r", "state": "ready", "namespace": run["namespace"], "run_id": run_id},
        db.pool_leases: {"lease_id": str(uuid.uuid4()), "pool": "p", "cluster": f"{run['namespace']}/ray",
                         "job_key": key, "job_name": "pep", "namespace": run["namespace"], "actors": 1},
        db.listed_files: {"listing_id": run_id, "position": n, "job_key": key, "namespace": run["namespace"],
                          "key": f"part-{n}.jsonl", "uri": f"s3://b/part-{n}.jsonl", "size": 9, "content": "ETag:x"},
    }


def _snapshot(owner_url: str) -> dict[str, list]:
    engine = sa.create_engine(owner_url)
    with engine.connect() as conn:
        rows = {t.name: sorted(map(tuple, conn.execute(sa.select(t)).all()), key=repr) for t in tenants.DRIVER_TABLES}
    engine.dispose()
    return rows


def _refused(engine: sa.Engine, statement) -> str:
    with pytest.raises(sa.exc.ProgrammingError) as info:
        with engine.begin() as conn:
            conn.execute(statement)
    assert info.value.orig.sqlstate == INSUFFICIENT_PRIVILEGE
    return str(info.value.orig)


@pytest.mark.parametrize("table", tenants.DRIVER_TABLES, ids=lambda t: t.name)
def test_a_tenant_cannot_read_insert_update_or_delete_another_namespaces_rows(database_url, tenant_a, tenant_b,
                                                                              table):
    run_b = _run("team-b", "uid-b")
    b = tenant_b.engine()
    with b.begin() as conn:  # team-b's driver writes one row in each table under its own role
        for t, row in _rows_of_job(run_b, 0).items():
            conn.execute(t.insert().values(**row))
    before = _snapshot(database_url)
    assert all(len(rows) == 1 for rows in before.values())
    a = tenant_a.engine()
    with a.begin() as conn:
        assert conn.execute(sa.select(table)).all() == []
        column = {db.runs: "state", db.pool_leases: "actors", db.seen_ids: "position", db.run_shards: "records", db.record_errors: "detail",
                  db.batch_attempts: "reason", db.batches: "state", db.revisions: "run_id",
                  db.listed_files: "content"}[table]
        value = {"actors": 9, "position": 99, "records": 99}.get(column, "failed")
        assert conn.execute(table.update().values({column: value})).rowcount == 0
        assert conn.execute(table.delete()).rowcount == 0
    assert RLS_REFUSED in _refused(a, table.insert().values(**_rows_of_job(run_b, 1)[table]))
    assert _snapshot(database_url) == before
    with b.connect() as conn:  # team-b still sees its own row
        assert len(conn.execute(sa.select(table)).all()) == 1
    a.dispose()
    b.dispose()


def test_forged_succeeded_batches_cannot_make_another_job_skip_its_work(database_url, tenant_a, tenant_b):
    victim_engine, forger_engine = open_engine(tenant_b.url), open_engine(tenant_a.url)
    victim = JobRuns(victim_engine, B_JOB, "pep", "team-b")
    try:
        run_b = victim.start(B_RUN, new_run=False).run.run_id
        # A run of its own under b's job key, in its namespace or in b's: both refused.
        for namespace in ("team-a", "team-b"):
            forger = JobRuns(forger_engine, B_JOB, "pep", namespace)  # team-a's driver, claiming b's job key
            with pytest.raises(sa.exc.ProgrammingError, match=RLS_REFUSED):
                forger.start(B_RUN, new_run=False)
        a = tenant_a.engine()
        with a.begin() as conn:
            run_a = _run("team-a", "uid-a")
            conn.execute(db.runs.insert().values(**run_a))
        forged = {"job_key": "uid-b", "batch_id": "batch-0", "state": "succeeded", "records": 32}
        # A succeeded mark on b's run, as a plain insert and as the sink's upsert; under b's key on a's run.
        assert RLS_REFUSED in _refused(a, db.batches.insert().values(**forged, run_id=run_b))
        upsert = pg_insert(db.batches).values(**forged, run_id=run_b)
        assert RLS_REFUSED in _refused(a, upsert.on_conflict_do_update(index_elements=["job_key", "batch_id"],
                                                                       set_={"state": "succeeded"}))
        assert RLS_REFUSED in _refused(a, db.batches.insert().values(**forged, run_id=run_a["run_id"]))
        a.dispose()
        assert victim.succeeded_batches() == {}
        assert _snapshot(database_url)["embedjob_batches"] == []
    finally:
        victim_engine.dispose()
        forger_engine.dispose()


def test_a_job_key_taken_first_by_another_namespace_refuses_the_job_and_skips_nothing(tenant_a, tenant_b):
    """The limit docs/install.md names: a role that uses another job's uid first blocks that job's driver."""
    engine = tenant_a.engine()
    with engine.begin() as conn:
        run_a = _run("team-a", "uid-b")
        conn.execute(db.runs.insert().values(**run_a))
        conn.execute(db.batches.insert().values(job_key="uid-b", batch_id="batch-0", run_id=run_a["run_id"],
                                                state="succeeded", records=32))
    engine.dispose()
    victim_engine = open_engine(tenant_b.url)
    victim = JobRuns(victim_engine, B_JOB, "pep", "team-b")
    try:
        assert victim.succeeded_batches() == {}
        with pytest.raises(sa.exc.ProgrammingError, match=RLS_REFUSED):
            victim.start(B_RUN, new_run=False)
    finally:
        victim_engine.dispose()


def test_roles_without_a_namespace_and_the_owner_are_not_confined(database_url, tenant_a, tenant_b):
    """What installs before per-namespace roles use keeps working: the owner, a shared writer role
    and the operator's reader see every namespace's rows."""
    for tenant in (tenant_a, tenant_b):
        engine = tenant.engine()
        with engine.begin() as conn:
            conn.execute(db.runs.insert().values(**_run(tenant.namespace, f"uid-{tenant.namespace}")))
        engine.dispose()
    shared = create_role(database_url, "shared_writer")
    reader = create_role(database_url, "embedjob_operator")
    owner = sa.create_engine(database_url)
    with owner.begin() as conn:
        conn.execute(sa.text(f"GRANT SELECT, INSERT, UPDATE ON embedjob_runs TO {shared}"))
        conn.execute(sa.text(f"GRANT SELECT ON embedjob_runs TO {reader}"))
        assert len(conn.execute(sa.select(db.runs)).all()) == 2
    owner.dispose()
    engine = sa.create_engine(as_role(database_url, shared))
    with engine.begin() as conn:
        assert conn.execute(db.runs.update().values(heartbeat_at=sa.func.now())).rowcount == 2
    engine.dispose()
    runs = RunReader(as_role(database_url, reader))
    try:
        assert runs.latest("uid-team-b", "team-b", "pep").state == "running"
    finally:
        runs.close()


def test_an_owner_that_is_no_superuser_sets_up_roles_and_is_not_confined(database_url):
    """The admin path without a superuser: the tables' owner migrates, grants, and reads every namespace."""
    owner_role = create_role(database_url, "embedjob_owner")
    superuser = sa.create_engine(database_url)
    with superuser.begin() as conn:
        database = conn.execute(sa.text("SELECT current_database()")).scalar_one()
        conn.execute(sa.text("CREATE EXTENSION vector"))
        conn.execute(sa.text(f'GRANT CREATE ON DATABASE "{database}" TO {owner_role}'))
        conn.execute(sa.text(f"GRANT CREATE ON SCHEMA public TO {owner_role}"))
    superuser.dispose()
    owner_url = as_role(database_url, owner_role)
    team_a = create_role(database_url, "team_a")
    assert tenants.main(["--database-url", owner_url, "grant", "--namespace", "team-a", "--role", team_a]) == 0
    confined = sa.create_engine(as_role(database_url, team_a))
    owner = sa.create_engine(owner_url)
    with owner.begin() as conn:
        conn.execute(db.runs.insert().values(**_run("team-b", "uid-b")))
        conn.execute(db.runs.insert().values(**_run("team-a", "uid-a")))
        assert sorted(conn.execute(sa.select(db.runs.c.namespace)).scalars()) == ["team-a", "team-b"]
    with confined.connect() as conn:
        assert list(conn.execute(sa.select(db.runs.c.namespace)).scalars()) == ["team-a"]
    owner.dispose()
    confined.dispose()


def test_revoking_a_roles_last_namespace_takes_its_privileges(database_url, tenant_a):
    assert tenants.grant(database_url, "team-c", tenant_a.role)[0].endswith("team-a, team-c and no others")
    assert "team-c" in tenants.revoke(database_url, "team-a", tenant_a.role)[0]
    engine = tenant_a.engine()
    with engine.begin() as conn:
        conn.execute(db.runs.insert().values(**_run("team-c", "uid-c")))
    assert RLS_REFUSED in _refused(engine, db.runs.insert().values(**_run("team-a", "uid-a")))
    assert "no privileges" in tenants.revoke(database_url, "team-c", tenant_a.role)[0]
    assert "permission denied for table embedjob_runs" in _refused(engine, sa.select(db.runs))
    engine.dispose()


def test_the_admin_command_names_what_it_refuses(database_url, capsys, monkeypatch):
    monkeypatch.setenv("EMBEDJOB_DATABASE_URL", database_url)
    assert tenants.main(["grant", "--namespace", "Team_A", "--role", "x"]) == 2
    assert "--namespace 'Team_A' is not a Kubernetes namespace name" in capsys.readouterr().err
    assert tenants.main(["grant", "--namespace", "team-a", "--role", "no_such_role"]) == 2
    assert "--role no_such_role: no such role" in capsys.readouterr().err
    owner = sa.engine.make_url(database_url).username
    assert tenants.main(["grant", "--namespace", "team-a", "--role", owner]) == 2
    assert f"--role {owner} is a superuser, has BYPASSRLS or owns the bookkeeping tables" in capsys.readouterr().err
    role = create_role(database_url, "team_a")
    assert tenants.main(["grant", "--namespace", "team-a", "--role", role]) == 0
    assert f"role {role} may use the rows of namespace(s) team-a and no others" in capsys.readouterr().out


def test_a_tenant_migrates_nothing_at_head_and_says_why_it_cannot_migrate(database_url, tenant_a, tmp_path):
    schema.migrate(tenant_a.url)  # at head: no DDL, which the role may not run
    cfg = Config()
    cfg.set_main_option("script_location", str(db.MIGRATIONS_DIR))
    owner = sa.create_engine(database_url)
    with owner.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0004")
    owner.dispose()
    head = ScriptDirectory.from_config(cfg).get_current_head()
    with pytest.raises(schema.SchemaBehind, match=rf"at revision 0004, this driver needs {head}, and role {tenant_a.role} "
                                              r"may not migrate it: run `python -m embedjob.tenants migrate`"):
        schema.migrate(tenant_a.url)
    # the driver under that role refuses the job with the same words, writing nothing
    job = JobConfig.from_manifest(manifest(write_input(tmp_path / "in.jsonl", corpus_lines(0, 5)), "behind"))
    summary = run_job(job, tenant_a.url)
    assert (summary.state, summary.reason, summary.run_id) == ("failed", "SchemaBehind", None)
    assert "run `python -m embedjob.tenants migrate`" in summary.error
    assert tenants.main(["--database-url", database_url, "migrate"]) == 0
    schema.migrate(tenant_a.url)


def test_roles_granted_before_the_shards_revisions_and_listings_tables_came_may_use_them_after_the_upgrade(
        database_url, tenant_a, tenant_b):
    cfg = Config()
    cfg.set_main_option("script_location", str(db.MIGRATIONS_DIR))
    owner = sa.create_engine(database_url)
    with owner.begin() as conn:  # the tenants were granted at 0013, before embedjob_run_shards
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0013")
    operator = create_role(database_url, "embedjob_operator")
    with owner.begin() as conn:  # the operator's role as docs/install.md granted it then
        conn.execute(sa.text(f"GRANT SELECT ON embedjob_runs TO {operator}"))
    owner.dispose()
    schema.migrate(database_url)  # the owner upgrades; nobody runs `tenants grant` again
    a, b = tenant_a.engine(), tenant_b.engine()
    run_a, run_b = _run("team-a", "uid-a"), _run("team-b", "uid-b")
    for engine, run in ((a, run_a), (b, run_b)):
        with engine.begin() as conn:
            conn.execute(db.runs.insert().values(**run))
            for table in (db.run_shards, db.revisions, db.listed_files):
                conn.execute(table.insert().values(**_rows_of_job(run, 0)[table]))
    with a.connect() as conn:  # still confined to its own namespace's rows
        assert conn.execute(sa.select(db.run_shards.c.run_id)).scalars().all() == [run_a["run_id"]]
        assert conn.execute(sa.select(db.revisions.c.namespace)).scalars().all() == ["team-a"]
        assert conn.execute(sa.select(db.listed_files.c.namespace)).scalars().all() == ["team-a"]
    for table in (db.run_shards, db.revisions, db.listed_files):
        assert RLS_REFUSED in _refused(a, table.insert().values(**_rows_of_job(run_b, 1)[table]))
    a.dispose()
    b.dispose()
    reader = sa.create_engine(as_role(database_url, operator))
    with reader.connect() as conn:  # the operator's role reads every namespace's revisions, as it reads the runs
        assert sorted(conn.execute(sa.select(db.revisions.c.namespace)).scalars()) == ["team-a", "team-b"]
    reader.dispose()
