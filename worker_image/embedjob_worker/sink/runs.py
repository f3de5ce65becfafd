"""The run's life in embedjob_runs: started, resumed or refused, updated only by the session owning it, finished.

A driver session takes the run it starts or resumes (`driver_session`, in a RunSession) at
once, and every later update of the run row, a group's counts as its end, is fenced by
it: a dead driver's writer that commits after another driver resumed the run finds
another session in the row and rolls back (DriverSuperseded).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass

import sqlalchemy as sa

from embedjob import db

from embedjob_worker.core.change_window import ChangeWindow, PreviousRun
from embedjob_worker.core.config import identity_changes
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.logs import mask_secrets
from embedjob_worker.core.outcome import ADDED_COUNTERS, KEPT_ON_RESUME, CounterUpdate, DoneBatch
from embedjob_worker.core.shards import ShardRead
from embedjob_worker.core.tally import DriverCounts
from embedjob_worker.sink.listings import forget_listings, listing_changes
from embedjob_worker.sink.revisions import make_ready, mark_embedding
from embedjob_worker.sink.target import SinkTarget, VectorsTable
from embedjob_worker.source.snapshot import describe_input

# Runs that ended before embedding anything; a later start compares against the run before them.
REFUSED_START_REASONS = ("InputChanged", "ModelUnavailable", "SourceUnavailable", "ChunkingUnsupported")

# A resumed run's row counts afresh from here: the session recounts the batches done before as skipped.
# records_deleted stays: the vectors an earlier session's sync deleted are gone, no session can recount them.
_SESSION_START_COUNTERS = {**{name: 0 for name in ADDED_COUNTERS if name not in KEPT_ON_RESUME},
                           "records_unchanged": 0, "texts_per_second": 0.0,
                           "batches_total": None, "records_total": None, "driver_counts": None}


@dataclass(frozen=True)
class RunSession:
    """The run one driver session writes: what its batch writes are keyed by (the model and revision of the
    vectors) and fenced by (the run row names the session). A writer actor gets it as it is (it pickles)."""

    run_id: str
    driver_session: str  # db.runs.c.driver_session
    model: str
    revision: str


@dataclass(frozen=True)
class RunRequest:
    """What a run is of, as its row records it: the model, the input and the config."""

    model: str
    revision: str
    input_fingerprint: str
    config_fingerprint: str
    identity: dict | None = None  # config.run_identity: the settings config_fingerprint hashes, by spec path
    input_record: dict | None = None  # the input's snapshot (snapshot.InputSnapshot.record)
    prompt: str | None = None  # the document prompt, and why (model.described_prompt)


@dataclass(frozen=True)
class RunStart:
    run: RunSession
    resumed: bool
    # A resumed run's new and changed records and chunks embedded, as its earlier sessions committed them.
    records_new: int = 0
    records_changed: int = 0
    chunks_embedded: int = 0
    # The latest run that got to start writing the same vectors before this one (JobRuns._latest_writer; a resumed
    # run: itself), and the state the run's revision had before it started (None: no row): what its change window
    # is decided by (core.change_window).
    previous: PreviousRun | None = None
    revision_state: str | None = None


def latest_started_run(job_key: str, *columns: sa.ColumnElement) -> sa.Select:
    """`columns` of the job's latest run that got to start (not a refused start): the run a start resumes."""
    runs = db.runs
    return (sa.select(*columns).where(runs.c.job_key == job_key)
            .where(sa.or_(runs.c.reason.is_(None), runs.c.reason.not_in(REFUSED_START_REASONS)))
            .order_by(runs.c.started_at.desc()).limit(1))


def update_run(conn: sa.Connection, run: RunSession, values: dict) -> sa.Row:
    """The run row, updated while `run`'s session owns it, else JobFailed (DriverSuperseded). Last in a
    transaction: its row lock is held only until the commit."""
    runs = db.runs
    row = conn.execute(runs.update().where(runs.c.run_id == run.run_id, runs.c.driver_session == run.driver_session)
                       .values(heartbeat_at=sa.func.now(), **values).returning(*runs.c)).first()
    if row is None:
        raise JobFailed("DriverSuperseded", f"run {run.run_id} is owned by another driver session now (a driver "
                                            "that resumed it): this session writes nothing more")
    return row


def counter_values(added: dict[str, int], driver: dict[str, int]) -> dict:
    """The run row's counters after a write: plus what its committed batches `added`, plus the driver's own
    counts (`driver`, CounterUpdate.driver) beyond the ones the row holds already (db.runs.c.driver_counts),
    which become `driver`: applied twice (a commit whose reply was lost, retried), it adds them once."""
    runs = db.runs
    values = {}
    for name in sorted(set(added) | set(driver)):
        value = runs.c[name] + added.get(name, 0)
        if name in driver:
            held = sa.func.coalesce(runs.c.driver_counts[name].astext.cast(sa.BigInteger), 0)
            value = value + (driver[name] - held)
        values[name] = value
    if driver:
        values["driver_counts"] = driver
    return values


class JobRuns:
    """The runs of one job (`target.job_key`, named `job_name` in `namespace`)."""

    def __init__(self, engine: sa.Engine, target: SinkTarget, job_name: str, namespace: str):
        self.engine, self.target, self.job_name, self.namespace = engine, target, job_name, namespace

    def start(self, request: RunRequest, new_run: bool,
              how_to_start_anew: str = "Pass --new-run to start a new run") -> RunStart:
        """Resume the job's run over the same input and config, or start one (a new session either way); refuse
        a changed input or config, naming what changed and ending with `how_to_start_anew`."""
        runs = db.runs
        session = str(uuid.uuid4())
        refused = None
        with self.engine.begin() as conn:  # the driver holds the job's lock (job_lock.JobLock) around this
            latest = conn.execute(latest_started_run(
                self.target.job_key, runs.c.run_id, runs.c.input_fingerprint, runs.c.config_fingerprint,
                runs.c.identity, runs.c.input, runs.c.state, runs.c.batches_failed, runs.c.change_window)).first()
            if latest is not None and not new_run:
                if (latest.input_fingerprint, latest.config_fingerprint) == (request.input_fingerprint,
                                                                            request.config_fingerprint):
                    # Takes the run from any earlier session at once: a writer of a dead driver that
                    # commits after this finds another session in the row and rolls back.
                    resumed = conn.execute(runs.update().where(runs.c.run_id == latest.run_id).values(
                        state="running", reason=None, error=None, finished_at=None, heartbeat_at=sa.func.now(),
                        driver_session=session, **_SESSION_START_COUNTERS,
                    ).returning(*(runs.c[name] for name in KEPT_ON_RESUME))).one()
                    state = self._mark_embedding(conn, request, latest.run_id)
                    # The run row names its first session's listing; this session reads the one it listed.
                    forget_listings(conn, self.target.job_key,
                                    {_listing_of(latest.input), _listing_of(request.input_record)})
                    itself = PreviousRun(latest.state, latest.batches_failed, latest.input_fingerprint,
                                         latest.config_fingerprint, latest.change_window)
                    return RunStart(RunSession(latest.run_id, session, request.model, request.revision), True,
                                    **resumed._asdict(), previous=itself, revision_state=state)
                refused = _refusal(conn, latest, request, how_to_start_anew)
            # A refused start's listing goes: the next start is compared with the latest started run's.
            forget_listings(conn, self.target.job_key, {_listing_of(latest.input if refused else request.input_record)})
            previous = self._latest_writer(conn, request)  # of any job: the same vectors, until this run's start
            run_id = self._insert_run(conn, request, session, refused and "InputChanged", refused)
            if not refused:
                state = self._mark_embedding(conn, request, run_id)
        if refused:
            raise JobFailed("InputChanged", refused)
        return RunStart(RunSession(run_id, session, request.model, request.revision), resumed=False,
                        previous=previous, revision_state=state)

    def _latest_writer(self, conn: sa.Connection, request: RunRequest) -> PreviousRun | None:
        """The latest run that got to start writing this collection's vectors of the request's model and revision
        in this namespace, whatever its job: a change window (core.change_window) reads on from its watermark only
        when it read the same table, filter and settings, and no other run wrote (or deleted) those vectors since."""
        r = db.runs.c
        row = conn.execute(
            sa.select(r.state, r.batches_failed, r.input_fingerprint, r.config_fingerprint, r.change_window)
            .where(r.namespace == self.namespace, r.vectors_table == self.target.table,
                   r.collection == self.target.collection, r.model == request.model, r.revision == request.revision)
            .where(sa.or_(r.reason.is_(None), r.reason.not_in(REFUSED_START_REASONS)))
            .order_by(r.started_at.desc()).limit(1)).first()
        return row and PreviousRun(*row)

    def _vectors(self) -> VectorsTable:
        self.target = self.target.in_schema_of(self.engine)  # looked up once
        return self.target.vectors

    def _mark_embedding(self, conn: sa.Connection, request: RunRequest, run_id: str) -> str | None:
        return mark_embedding(conn, self._vectors(), self.target.collection, request.model, request.revision,
                       self.namespace, run_id)

    def record_window(self, run: RunSession, window: ChangeWindow) -> None:
        """The change window a run reads as it starts: a resumed session reads the same rows."""
        with self.engine.begin() as conn:
            update_run(conn, run, {"change_window": window.record()})

    def refuse_start(self, model: str, failure: JobFailed) -> None:
        """A run that could not start (no model, no input): a failed run row that says why. A listing the start
        wrote before it was refused (a store that failed mid-listing, a token plan the model cannot take) goes."""
        with self.engine.begin() as conn:
            self._insert_run(conn, RunRequest(model, "", "", ""), None, failure.reason, str(failure))
            latest = conn.execute(latest_started_run(self.target.job_key, db.runs.c.input)).first()
            forget_listings(conn, self.target.job_key, {_listing_of(latest and latest.input)})

    def _insert_run(self, conn: sa.Connection, request: RunRequest, session: str | None, reason: str | None,
                    error: str | None) -> str:
        run_id = str(uuid.uuid4())
        conn.execute(db.runs.insert().values(
            run_id=run_id, job_key=self.target.job_key, job_name=self.job_name, namespace=self.namespace,
            collection=self.target.collection, vectors_table=self.target.table, model=request.model,
            revision=request.revision, input_fingerprint=request.input_fingerprint,
            config_fingerprint=request.config_fingerprint, identity=request.identity, input=request.input_record,
            prompt=request.prompt,
            state="failed" if reason else "running", driver_session=session,
            reason=reason, error=error and mask_secrets(error), finished_at=sa.func.now() if reason else None))
        return run_id

    def succeeded_batches(self) -> dict[str, DoneBatch]:
        """The job's succeeded batches (ids carry the input and config fingerprints) by id."""
        batches, errors, job_key = db.batches, db.record_errors, self.target.job_key
        truncated = (sa.select(errors.c.batch_id, sa.func.count(sa.distinct(errors.c.position)).label("records"))
                     .where(errors.c.job_key == job_key, errors.c.reason == "truncated")
                     .group_by(errors.c.batch_id).subquery())
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(batches.c.batch_id, batches.c.records - batches.c.failed_records,
                                          sa.func.coalesce(truncated.c.records, 0))
                                .outerjoin(truncated, truncated.c.batch_id == batches.c.batch_id)
                                .where(batches.c.job_key == job_key, batches.c.state == "succeeded"))
            return {batch_id: DoneBatch(embedded, truncated) for batch_id, embedded, truncated in rows}

    def finish(self, run: RunSession, state: str, reason: str | None, error: str | None,
               update: CounterUpdate | None = None) -> dict:
        """The run's end (its seen ids, seen_ids.SeenIds, and shards read go: only a resumed session needs them); the run
        row's counters. A run that succeeded with every batch written makes its revision the collection's ready one
        in the same transaction (revisions.make_ready)."""
        update = update or CounterUpdate()
        with self.engine.begin() as conn:
            conn.execute(db.seen_ids.delete().where(db.seen_ids.c.run_id == run.run_id))
            conn.execute(db.run_shards.delete().where(db.run_shards.c.run_id == run.run_id))
            row = update_run(conn, run, {**counter_values({}, update.driver), **update.set, "state": state,
                                         "reason": reason, "error": error and mask_secrets(error),
                                         "finished_at": sa.func.now()})
            if state == "succeeded" and row.batches_failed == 0:
                make_ready(conn, self._vectors(), self.target.collection, run.model, run.revision, self.namespace,
                           run.run_id)
        return dict(row._mapping)


def shard_row(run_id: str, shard: ShardRead) -> dict:
    """`shard` as its embedjob_run_shards row."""
    return {"run_id": run_id, "first_file": shard.first_file, "files": shard.files, "records": shard.records,
            "batches": shard.batches, "counts": asdict(shard.counts), "batch_ids": list(shard.batch_ids)}


def shards_read(engine: sa.Engine, run_id: str) -> dict[int, ShardRead]:
    """The shards of the run's dataset its earlier sessions read through, by their first file."""
    shards = db.run_shards
    with engine.connect() as conn:
        rows = conn.execute(sa.select(shards).where(shards.c.run_id == run_id)).all()
    return {row.first_file: ShardRead(row.first_file, row.files, row.records, row.batches, DriverCounts(**row.counts),
                                      tuple(row.batch_ids)) for row in rows}


def _listing_of(input_record: dict | None) -> str | None:
    """The stored listing (sink.listings) a run's input record names; None for a single file or a table."""
    return (input_record or {}).get("listing")


def _refusal(conn: sa.Connection, latest: sa.Row, request: RunRequest, how_to_start_anew: str) -> str:
    """Why a re-run may not resume run `latest`: the input's content changed, or the named config fields did."""
    changes = []
    if latest.input_fingerprint != request.input_fingerprint:
        old, new = _listing_of(latest.input), _listing_of(request.input_record)
        named = listing_changes(conn, old, new) if old and new else ""
        files = f" (files {named})" if named else ""
        changes.append(f"the input changed from {describe_input(latest.input)} to "
                       f"{describe_input(request.input_record)}{files}")
    if latest.config_fingerprint != request.config_fingerprint:
        changes += (identity_changes(latest.identity, request.identity) if latest.identity and request.identity else
                    ["the batching/model/sink config changed (the fields are not recorded for that run)"])
    return (f"{'; '.join(changes)} since run {latest.run_id}; its vectors and batches belong to the old "
            f"input and settings, so nothing is skipped or mixed. {how_to_start_anew}")
