"""The embedding driver: source -> batches -> EmbeddingWorker actors -> PostgreSQL.

Cluster mode (the RayJob entrypoint, see docs/driver.md):

    python -m embedjob_worker.driver --config-b64 <base64 JSON> [--ray-address ADDR] [--metrics-port N]

connects only to the given Ray cluster (never starts one) and reads the database URL
from EMBEDJOB_DATABASE_URL. Exit codes: 0 succeeded, 1 job failed (the run row says
why), 2 invalid config, 3 Ray unreachable, 4 the database unreachable.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import itertools
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

import ray
import sqlalchemy as sa
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from embedjob.api import RunCounters, SpecError
from embedjob.contract import CONFIG_FLAG, DATABASE_URL_ENV, FAULT_INJECTION_ENV, ExitCode, decode_job_config

from .actors import EmbeddingWorker
from .batching import Batch, InFlightBatches, batch_key, make_batches
from .config import JobConfig, config_fingerprint
from .errors import DB_ERRORS, JobFailed, RayUnreachable, Unreachable, backoff_seconds
from .lease import PoolLease
from .logs import configure_logging, log_event, mask_url
from .metrics import DriverMetrics
from .model import ResolvedModel, resolve_model
from .pools import POOL_NAMESPACE, pool_actor_name, pool_name, shared_cluster
from .records import BadReason, BadRecord, Record, RawRecord, classify_records
from .sink import HEARTBEAT_S, AttemptRow, BatchOutcome, PostgresSink, content_salt, now
from .source import input_fingerprint, read_records, resolve_uri
from .tally import RunSummary, RunTally
from .writer import SinkWriter

log = logging.getLogger("embedjob_worker.driver")



@dataclass
class DriverOptions:
    new_run: bool = False
    metrics: DriverMetrics | None = None
    # Called from the driver loop with the run's counters (the CLI draws its progress bar).
    on_progress: Callable[[RunCounters], None] | None = None
    fault_injection: dict | None = None
    workers_ready_timeout_s: float = 900.0


def worker_actor_name(job_key: str, slot: int, generation: int) -> str:
    """Name of the actor in a pool slot; a replacement after a crash gets the next generation."""
    return f"embedjob-worker-{hashlib.sha256(job_key.encode()).hexdigest()[:8]}-{slot}-{generation}"


class WorkerPool:
    """`replicas` EmbeddingWorker actors; a dead one is replaced by a fresh one in its slot.

    With `shared_pool` (a job on an existing cluster) the actors are the detached pool's
    `<pool>-<slot>`, got if they exist (another job's, model loaded) or created; they
    outlive this job and are removed by the operator once no job leases the pool.
    Without, they are this job's own and are killed at its end.
    """

    def __init__(self, config: JobConfig, resolved: ResolvedModel, fault_injection: dict | None,
                 shared_pool: str | None = None):
        workers = config.spec.workers
        self._actor_class = ray.remote(EmbeddingWorker)
        self.shared_pool = shared_pool
        # Retries are the driver's (bounded, recorded); Ray must not silently restart or re-run.
        self._actor_options = dict(num_cpus=workers.cpus_per_actor, num_gpus=workers.gpus_per_actor,
                                   max_restarts=0, max_task_retries=0)
        if shared_pool:
            # get_if_exists: jobs starting together end up with the same actors, not a name clash.
            self._actor_options.update(lifetime="detached", namespace=POOL_NAMESPACE, get_if_exists=True)
        self._args = (resolved, workers.cpus_per_actor, workers.gpus_per_actor, fault_injection)
        self.job_key = config.job_key
        self.generations = [0] * workers.replicas
        self.actors = [self._start(slot) for slot in range(workers.replicas)]
        self.outstanding = [0] * workers.replicas

    def _start(self, slot: int):
        name = self.actor_name(slot)
        return self._actor_class.options(name=name, **self._actor_options).remote(*self._args)

    def actor_name(self, slot: int) -> str:
        if self.shared_pool:  # a dead pool actor's name is free again: its replacement takes it
            return pool_actor_name(self.shared_pool, slot)
        return worker_actor_name(self.job_key, slot, self.generations[slot])

    def wait_ready(self, timeout_s: float) -> list[dict]:
        try:
            return ray.get([actor.info.remote() for actor in self.actors], timeout=timeout_s)
        except GetTimeoutError:
            raise JobFailed("WorkersUnavailable", f"EmbeddingWorker actors not ready after {timeout_s:.0f}s "
                            "(not enough CPUs/GPUs in the Ray cluster?)") from None
        except (RayActorError, RayTaskError) as exc:
            raise JobFailed("WorkersUnavailable", f"an EmbeddingWorker actor failed to start: {exc}") from None

    def least_loaded(self) -> int:
        return min(range(len(self.actors)), key=self.outstanding.__getitem__)

    def replace(self, slot: int, dead_actor) -> None:
        if self.actors[slot] is dead_actor:  # not yet replaced by another failed task of the same actor
            self.generations[slot] += 1
            self.actors[slot] = self._start(slot)

    def shutdown(self) -> None:
        if self.shared_pool:
            return
        for actor in self.actors:
            ray.kill(actor)


@dataclass
class Attempt:
    batch: Batch
    number: int
    history: list[AttemptRow]
    first_started_at: datetime
    slot: int = -1
    actor: object = None
    worker: str | None = None  # the actor's name, for the attempt row when it died
    started_at: datetime | None = None
    submitted: float = 0.0


class Driver:
    def __init__(self, config: JobConfig, database_url: str, options: DriverOptions):
        self.config, self.spec, self.options = config, config.spec, options
        self.metrics = options.metrics or DriverMetrics()
        self.database_url = database_url
        self.tally = RunTally()
        self.started = time.monotonic()
        self.summary = RunSummary(run_id=None, state="running")
        self.sink = PostgresSink(database_url, config.job_key, self.spec.sink.collection, self.spec.sink.table,
                                 content_salt(self.spec.model.normalize, self.spec.model.max_seq_length))
        self.failure: JobFailed | None = None
        self.failed_batches = 0  # for good, in this session
        self.max_tokens = 0  # the model's token limit, known once the workers are up

    # -- set-up ---------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        try:
            self.sink.migrate()
        except sa.exc.OperationalError as exc:
            raise Unreachable(f"cannot reach the database: {str(exc.orig).splitlines()[0]}") from None
        try:
            resolved, uri, input_fp = self._resolve_inputs()
            config_fp = config_fingerprint(self.spec, resolved.revision)
            start = self.sink.start_run(self.config.name, self.config.namespace, resolved.name, resolved.revision,
                                        input_fp, config_fp, self.options.new_run)
        except JobFailed as failure:
            log_event(log, "job_refused", logging.ERROR, reason=failure.reason, error=str(failure))
            self.summary.state, self.summary.reason, self.summary.error = "failed", failure.reason, str(failure)
            return self.summary
        self.summary.run_id = start.run_id
        log_event(log, "run_started", job=self.config.job_key, run=start.run_id, resumed=start.resumed,
                  model=resolved.name, revision=resolved.revision, source=uri)
        try:
            self._embed(resolved, uri, batch_key(input_fp, config_fp), start.run_id)
        finally:
            self.sink.close()
        return self.summary

    def _resolve_inputs(self) -> tuple[ResolvedModel, str, str]:
        """Model revision and input fingerprint; failing either is recorded as a refused run."""
        uri = resolve_uri(self.spec.source.uri, self.config.base_dir)
        try:
            resolved = resolve_model(self.spec.model)
        except (OSError, ValueError) as exc:
            failure = JobFailed("ModelUnavailable", f"spec.model: {exc}")
        else:
            try:
                return resolved, uri, input_fingerprint(uri)
            except (OSError, ValueError) as exc:
                failure = JobFailed("SourceUnavailable", f"spec.source.uri {uri}: {type(exc).__name__}: {exc}")
        self.sink.record_refused_start(self.config.name, self.config.namespace, self.spec.model.name,
                                       failure.reason, str(failure))
        raise failure

    # -- the main loop --------------------------------------------------------------------------
    def _embed(self, resolved: ResolvedModel, uri: str, key: str, run_id: str) -> None:
        spec = self.spec
        succeeded_before = self.sink.succeeded_batches()
        cluster = shared_cluster(self.config)
        shared_pool = pool_name(resolved, spec.workers.cpus_per_actor, spec.workers.gpus_per_actor) if cluster else None
        # Leased before any actor is touched, so the operator never removes the pool under us.
        lease = PoolLease.acquire(self.sink.engine, shared_pool, cluster, self.config,
                                  spec.workers.replicas) if shared_pool else None
        writer = SinkWriter(self.sink, run_id, self.tally, spec.retry.attempts_per_batch)
        pool = WorkerPool(self.config, resolved, self.options.fault_injection, shared_pool)
        try:
            infos = pool.wait_ready(self.options.workers_ready_timeout_s)
            self.summary.workers = infos
            for info in infos:
                self._check_model(info, resolved)
            self.max_tokens = infos[0]["max_tokens"]
            self.sink.ensure_vectors_table(infos[0]["dimension"])
            self.summary.model_load_seconds = max(i["load_seconds"] for i in infos)
            self.metrics.model_load_seconds.set(self.summary.model_load_seconds)
            log_event(log, "workers_ready", replicas=len(infos), load_seconds=round(self.summary.model_load_seconds, 2),
                      actors=",".join(i["actor_id"] for i in infos),
                      dimension=infos[0]["dimension"], skipping=len(succeeded_before))
            self.tally.start_embedding()
            self._loop(resolved, pool, writer, self._batches(uri, key), succeeded_before)
        except JobFailed as failure:
            self.failure = failure
        finally:
            writer.close()
            pool.shutdown()
            if lease is not None:
                lease.release()
        if writer.error is not None:
            self._finish(run_id, JobFailed("DatabaseUnavailable", f"writing to the database failed: {writer.error}"))
        else:
            self._finish(run_id, self.failure)

    def _check_model(self, result: dict, resolved: ResolvedModel) -> None:
        if (result["model"], result["revision"]) != (resolved.name, resolved.revision):
            raise JobFailed("ModelMismatch", f"worker {result['worker']} has {result['model']}@{result['revision']}, "
                            f"the job pins {resolved.name}@{resolved.revision}")

    def _batches(self, uri: str, key: str) -> Iterator[Batch | list[BadRecord]]:
        """Batches of valid records, with the bad records yielded as lists as they turn up."""
        spec = self.spec
        bad: list[BadRecord] = []
        positions = itertools.count()

        def valid(raw_records: Iterator[RawRecord]) -> Iterator[Record]:
            for item in classify_records(raw_records):
                next(positions)
                if isinstance(item, Record):
                    yield item
                else:
                    bad.append(item)

        raw = read_records(uri, spec.source.format, spec.source.id_field, spec.source.text_field)
        total = 0
        try:
            for batch in make_batches(valid(raw), spec.batching.batch_size, spec.batching.sort_window, key):
                if bad:
                    yield self._take(bad)
                total += 1
                yield batch
        except (OSError, ValueError, KeyError) as exc:
            raise JobFailed("SourceUnreadable", f"reading {uri}: {type(exc).__name__}: {exc}") from None
        if bad:
            yield self._take(bad)
        self.tally.input_read(batches=total, records=next(positions))

    def _take(self, bad: list[BadRecord]) -> list[BadRecord]:
        taken = list(bad)
        bad.clear()
        rejected = sum(b.reason is not BadReason.truncated for b in taken)
        self.tally.rejected(rejected)
        self.metrics.records.labels("failed").inc(rejected)
        return taken

    def _loop(self, resolved: ResolvedModel, pool: WorkerPool, writer: SinkWriter,
              batches: Iterator[Batch | list[BadRecord]], succeeded_before: dict[str, int]) -> None:
        max_in_flight = self.spec.batching.max_in_flight
        in_flight = InFlightBatches()
        refs: dict[ray.ObjectRef, str] = {}
        retries: list[tuple[float, int, Attempt]] = []  # heap of (not before, tie-breaker, attempt)
        tie = itertools.count()
        source_done = False
        while True:
            if writer.error is not None:
                raise JobFailed("DatabaseUnavailable", f"writing to the database failed: {writer.error}")
            while self.failure is None and len(in_flight) + writer.uncommitted < max_in_flight:
                if retries and retries[0][0] <= time.monotonic():
                    attempt = heapq.heappop(retries)[2]
                elif source_done:
                    break
                else:
                    item = next(batches, None)
                    if item is None:
                        source_done = True
                        continue
                    if isinstance(item, list):
                        writer.put_bad_records(item)
                        continue
                    if item.batch_id in succeeded_before:
                        self._skip(item, succeeded_before[item.batch_id])
                        continue
                    attempt = Attempt(item, 1, [], now())
                self._submit(pool, attempt, in_flight, refs)
            if not refs:
                if self.failure is not None or (source_done and not retries and not writer.uncommitted):
                    return
                if retries and not writer.uncommitted:
                    time.sleep(max(0.0, retries[0][0] - time.monotonic()))
                else:
                    writer.wait_for_commit(timeout=1.0)
                self._report()
                continue
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=HEARTBEAT_S)
            for ref in ready:
                self._handle(ref, refs.pop(ref), resolved, pool, in_flight, writer, retries, tie)
            self._report()

    def _skip(self, batch: Batch, records_embedded: int) -> None:
        self.tally.skipped(records_embedded)
        self.metrics.batches.labels("skipped").inc()

    def _submit(self, pool: WorkerPool, attempt: Attempt, in_flight: InFlightBatches, refs: dict) -> None:
        attempt.slot = pool.least_loaded()
        attempt.actor = pool.actors[attempt.slot]
        attempt.worker = pool.actor_name(attempt.slot)
        attempt.started_at, attempt.submitted = now(), time.monotonic()
        pool.outstanding[attempt.slot] += 1
        ref = attempt.actor.embed.remote(attempt.batch.batch_id, attempt.batch.texts)
        in_flight.add(attempt.batch.batch_id, attempt)
        refs[ref] = attempt.batch.batch_id
        log_event(log, "batch_dispatched", batch=attempt.batch.batch_id, attempt=attempt.number,
                  records=len(attempt.batch.records), slot=attempt.slot)

    def _handle(self, ref, batch_id: str, resolved: ResolvedModel, pool: WorkerPool, in_flight: InFlightBatches,
                writer: SinkWriter, retries: list, tie) -> None:
        try:
            result = ray.get(ref)
        except RayActorError as exc:
            attempt = in_flight.complete(batch_id)
            pool.outstanding[attempt.slot] -= 1
            pool.replace(attempt.slot, attempt.actor)
            self._failed_attempt(attempt, "ActorDied", str(exc).splitlines()[0], True, writer, retries, tie)
            return
        except RayTaskError as exc:
            attempt = in_flight.complete(batch_id)
            pool.outstanding[attempt.slot] -= 1
            cause = exc.cause if exc.cause is not None else exc
            self._failed_attempt(attempt, type(cause).__name__, str(cause).splitlines()[0] if str(cause) else "",
                                 True, writer, retries, tie)
            return
        # Matched by the id the result carries, not by the order of submission.
        attempt = in_flight.complete(result["batch_id"])
        pool.outstanding[attempt.slot] -= 1
        latency = time.monotonic() - attempt.submitted
        self.summary.batch_latencies.append(latency)
        self.metrics.batch_latency.observe(latency)
        try:
            self._check_model(result, resolved)
        except JobFailed as mismatch:
            self._failed_attempt(attempt, mismatch.reason, str(mismatch), False, writer, retries, tie)
            return
        worker = result["worker"]
        history = attempt.history
        if result["oom_splits"]:
            self.summary.oom_splits += result["oom_splits"]
            self.metrics.oom_splits.inc(result["oom_splits"])
            history.append(AttemptRow(attempt.number, worker, "split", f"OutOfMemory: batch of {len(attempt.batch.records)}"
                                      f" split in halves {result['oom_splits']} time(s)", attempt.started_at))
        history.append(AttemptRow(attempt.number, worker, "succeeded", None, attempt.started_at))
        truncated = [BadRecord(attempt.batch.records[i].position, attempt.batch.records[i].id, BadReason.truncated,
                               f"longer than {self.max_tokens} tokens: embedded truncated", attempt.batch.batch_id)
                     for i in result["truncated"]]
        self.summary.records_truncated += len(truncated)
        self.metrics.records.labels("embedded").inc(len(attempt.batch.records))
        self.metrics.records.labels("truncated").inc(len(truncated))
        self.metrics.batches.labels("succeeded").inc()
        writer.put_outcome(BatchOutcome(
            attempt.batch.batch_id, "succeeded", attempt.batch.records, history, attempt.first_started_at,
            vectors=result["vectors"], worker=worker, truncated=truncated,
            duration_s=(now() - attempt.first_started_at).total_seconds()))

    def _failed_attempt(self, attempt: Attempt, reason: str, message: str, retryable: bool, writer: SinkWriter,
                        retries: list, tie) -> None:
        will_retry = retryable and attempt.number < self.spec.retry.attempts_per_batch
        attempt.history.append(AttemptRow(attempt.number, attempt.worker, "retry" if will_retry else "failed",
                                          f"{reason}: {message}"[:2000], attempt.started_at))
        log_event(log, "batch_attempt_failed", logging.WARNING, batch=attempt.batch.batch_id, attempt=attempt.number,
                  reason=reason, error=message[:300], retry=will_retry)
        if will_retry:
            self.summary.retries += 1
            self.metrics.retries.labels(reason).inc()
            retry = Attempt(attempt.batch, attempt.number + 1, attempt.history, attempt.first_started_at)
            heapq.heappush(retries, (time.monotonic() + backoff_seconds(attempt.number), next(tie), retry))
            return
        self.metrics.batches.labels("failed").inc()
        writer.put_outcome(BatchOutcome(attempt.batch.batch_id, "failed", attempt.batch.records, attempt.history,
                                        attempt.first_started_at, error=f"{reason}: {message}"[:4000],
                                        duration_s=(now() - attempt.first_started_at).total_seconds()))
        self.failed_batches += 1
        tolerated = self.spec.retry.failed_batches_tolerated
        if self.failed_batches > tolerated and self.failure is None:
            self.failure = JobFailed("TooManyFailedBatches", f"{self.failed_batches} batch(es) failed for good, more "
                                     f"than spec.retry.failedBatchesTolerated={tolerated}; last: {reason}: {message}")

    def _report(self) -> None:
        counters = self.tally.counters()
        self.metrics.texts_per_second.set(counters.texts_per_second)
        if self.options.on_progress:
            self.options.on_progress(counters)

    def _finish(self, run_id: str, failure: JobFailed | None) -> None:
        counters = self.tally.counters()
        state = "failed" if failure else "succeeded"
        self.summary.state, self.summary.counters = state, counters
        self.summary.batches_skipped = self.tally.batches_skipped
        self.summary.reason = failure.reason if failure else None
        self.summary.error = str(failure) if failure else None
        self.summary.elapsed_seconds = time.monotonic() - self.started
        try:
            self.sink.finish_run(run_id, state, self.summary.reason, self.summary.error, counters.model_dump())
        except DB_ERRORS as exc:
            raise Unreachable(f"cannot record the run's end in the database: {exc}") from None
        log_event(log, "run_finished", logging.ERROR if failure else logging.INFO, run=run_id, state=state,
                  reason=self.summary.reason, error=self.summary.error, **counters.model_dump())
        self._report()


def run_job(config: JobConfig, database_url: str, options: DriverOptions | None = None) -> RunSummary:
    """Run (or resume) the job on the Ray cluster this process is connected to."""
    return Driver(config, database_url, options or DriverOptions()).run()


def fault_injection_from_env() -> dict | None:
    value = os.environ.get(FAULT_INJECTION_ENV)
    return json.loads(value) if value else None


def unreachable_exit_code(exc: Unreachable) -> int:
    """3 for Ray, 4 for the database: the operator turns them into RayUnavailable / DatabaseUnavailable."""
    return ExitCode.RAY_UNREACHABLE if isinstance(exc, RayUnreachable) else ExitCode.DATABASE_UNREACHABLE


def connect_ray(address: str, timeout_s: float = 10.0) -> None:
    """Connect to an existing Ray cluster only; fail fast instead of starting a local one."""
    if address != "auto":
        host_port = address.split("://", 1)[-1].rstrip("/")
        host, _, port = host_port.rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
        except (OSError, ValueError) as exc:
            raise RayUnreachable(f"cannot reach the Ray cluster at {address}: {exc}") from None
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        # A cluster with token authentication refuses a missing or wrong RAY_AUTH_TOKEN the same way.
        raise RayUnreachable(f"cannot connect to the Ray cluster at {address} (token authentication: is "
                             f"RAY_AUTH_TOKEN the cluster's?): {exc}") from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m embedjob_worker.driver", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    config = parser.add_mutually_exclusive_group(required=True)
    config.add_argument(CONFIG_FLAG, help="base64 of the job config JSON (embedjob.contract.encode_job_config)")
    config.add_argument("--config", help="the EmbeddingJob manifest as a YAML or JSON file")
    parser.add_argument("--ray-address", help="Ray cluster to connect to (default: $RAY_ADDRESS)")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.add_argument("--new-run", action="store_true", help="start a new run even if the input changed")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    database_url = os.environ.get(DATABASE_URL_ENV, "")
    configure_logging(secrets=[database_url])
    try:
        config = (JobConfig.from_file(args.config) if args.config
                  else JobConfig.from_manifest(decode_job_config(args.config_b64)))
    except (SpecError, OSError) as exc:
        log_event(log, "invalid_config", logging.ERROR, error=str(exc))
        print(f"invalid job config: {exc}", file=sys.stderr)
        return ExitCode.INVALID_CONFIG
    if not database_url:
        print(f"invalid job config: {DATABASE_URL_ENV} is not set", file=sys.stderr)
        return ExitCode.INVALID_CONFIG
    address = args.ray_address or os.environ.get("RAY_ADDRESS")
    if not address:
        print("no Ray cluster given: pass --ray-address or set RAY_ADDRESS (the driver never starts Ray itself)",
              file=sys.stderr)
        return ExitCode.RAY_UNREACHABLE
    log_event(log, "driver_starting", job=config.job_key, ray_address=address, database=mask_url(database_url))
    try:
        connect_ray(address)
        metrics = DriverMetrics()
        if args.metrics_port:
            metrics.serve(args.metrics_port)
        options = DriverOptions(new_run=args.new_run, metrics=metrics, fault_injection=fault_injection_from_env())
        summary = run_job(config, database_url, options)
    except Unreachable as exc:
        log_event(log, "unreachable", logging.ERROR, error=str(exc))
        print(str(exc), file=sys.stderr)
        return unreachable_exit_code(exc)
    return ExitCode.SUCCEEDED if summary.state == "succeeded" else ExitCode.JOB_FAILED


if __name__ == "__main__":
    sys.exit(main())
