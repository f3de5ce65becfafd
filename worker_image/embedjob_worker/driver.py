"""The embedding driver: source -> batches -> EmbeddingWorker actors -> PostgreSQL.

Cluster mode (the RayJob entrypoint, see docs/driver.md):

    python -m embedjob_worker.driver --config-b64 <base64 JSON> [--ray-address ADDR] [--metrics-port N]

connects only to the given Ray cluster (never starts one) and reads the database URL
from EMBEDJOB_DATABASE_URL. Exit codes: 0 succeeded, 1 job failed (the run row says
why), 2 invalid config, 3 Ray unreachable, 4 the database unreachable.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

import ray
import sqlalchemy as sa

from embedjob.api import RunCounters, SpecError
from embedjob.contract import CONFIG_FLAG, DATABASE_URL_ENV, FAULT_INJECTION_ENV, ExitCode, decode_job_config

from .batching import batch_key
from .config import JobConfig, config_fingerprint
from .dispatch import Dispatcher
from .errors import DB_ERRORS, JobFailed, RayUnreachable, Unreachable
from .feed import batches_to_embed
from .lease import PoolLease
from .logs import configure_logging, log_event, mask_url
from .metrics import DriverMetrics
from .model import ResolvedModel, resolve_model
from .pools import pool_name, shared_cluster
from .sink import PostgresSink, content_salt
from .source import input_fingerprint, resolve_uri
from .tally import RunSummary, RunTally
from .workers import ActorSet, check_model
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


class Driver:
    def __init__(self, config: JobConfig, database_url: str, options: DriverOptions):
        self.config, self.spec, self.options = config, config.spec, options
        self.metrics = options.metrics or DriverMetrics()
        self.tally = RunTally()
        self.started = time.monotonic()
        self.summary = RunSummary(run_id=None, state="running")
        self.sink = PostgresSink(database_url, config.job_key, self.spec.sink.collection, self.spec.sink.table,
                                 content_salt(self.spec.model.normalize, self.spec.model.max_seq_length))

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

    def _embed(self, resolved: ResolvedModel, uri: str, key: str, run_id: str) -> None:
        spec = self.spec
        done_before = self.sink.succeeded_batches()
        cluster = shared_cluster(self.config)
        shared_pool = pool_name(resolved, spec.workers.cpus_per_actor, spec.workers.gpus_per_actor) if cluster else None
        failure: JobFailed | None = None
        with ExitStack() as cleanup:  # on the way out: the writer drains, the actors go, the lease is released
            if shared_pool:
                # Leased before any actor is touched, so the operator never removes the pool under us.
                cleanup.callback(PoolLease.acquire(self.sink.engine, shared_pool, cluster, self.config,
                                                   spec.workers.replicas).release)
            actors = ActorSet(self.config, resolved, self.options.fault_injection, shared_pool)
            cleanup.callback(actors.shutdown)
            writer = SinkWriter(self.sink, run_id, self.tally, spec.retry.attempts_per_batch)
            cleanup.callback(writer.close)
            try:
                dispatcher = self._dispatcher(actors, resolved, len(done_before))
                batches = batches_to_embed(spec, uri, key, done_before, self.tally, self.metrics,
                                           writer.put_bad_records)
                dispatcher.run(batches, writer, self._report)
                failure = dispatcher.failure
            except JobFailed as exc:
                failure = exc
        if writer.error is not None:
            failure = JobFailed("DatabaseUnavailable", f"writing to the database failed: {writer.error}")
        self._finish(run_id, failure)

    def _dispatcher(self, actors: ActorSet, resolved: ResolvedModel, skipping: int) -> Dispatcher:
        """Once every actor has loaded the job's model: the vectors table, and the dispatcher."""
        infos = actors.wait_ready(self.options.workers_ready_timeout_s)
        self.summary.workers = infos
        for info in infos:
            check_model(info, resolved)
        self.sink.ensure_vectors_table(infos[0]["dimension"])
        self.summary.model_load_seconds = max(i["load_seconds"] for i in infos)
        self.metrics.model_load_seconds.set(self.summary.model_load_seconds)
        log_event(log, "workers_ready", replicas=len(infos), load_seconds=round(self.summary.model_load_seconds, 2),
                  actors=",".join(i["actor_id"] for i in infos), dimension=infos[0]["dimension"], skipping=skipping)
        self.tally.start_embedding()
        return Dispatcher(self.spec, actors, resolved, infos[0]["max_tokens"], self.metrics, self.summary)

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
