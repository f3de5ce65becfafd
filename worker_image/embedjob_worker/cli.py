"""The `embedjob` command: `run` (a job on this machine: local Ray, embedded PostgreSQL), `search`, `logs`, `render`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from contextlib import ExitStack
from pathlib import Path

# `embedjob run` is a one-machine Ray: keep its servers on loopback rather than the
# machine's network address. Ray reads this once, when it is first imported (below).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from tqdm import tqdm  # noqa: E402

from embedjob import db  # noqa: E402
from embedjob.api import RunCounters, SpecError  # noqa: E402
from embedjob.contract import DATABASE_URL_ENV, ExitCode  # noqa: E402

from .config import JobConfig  # noqa: E402
from .driver import unreachable_exit_code  # noqa: E402
from .errors import Unreachable  # noqa: E402
from . import job_logs, render  # noqa: E402
from .logs import configure_logging, mask_url  # noqa: E402

SNIPPET_CHARS = 100
# Ray announces token authentication on every local start; a one-machine Ray on loopback
# is what `embedjob run` always starts, so the notice says nothing to act on.
_RAY_TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


def _quiet_third_party_notices() -> None:
    # pgserver asks platformdirs for a runtime dir, which warns when XDG_RUNTIME_DIR is unset.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    logging.getLogger(_RAY_TOKEN_NOTICE_LOGGER).setLevel(logging.ERROR)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embedjob", description="Batch text embeddings on Ray into PostgreSQL.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run an EmbeddingJob manifest on this machine (local Ray)")
    run.add_argument("manifest", type=Path)
    run.add_argument("--database-url", default=os.environ.get(DATABASE_URL_ENV),
                     help=f"PostgreSQL URL (default: ${DATABASE_URL_ENV}, else an embedded PostgreSQL)")
    run.add_argument("--new-run", action="store_true", help="start a new run although the input changed")
    run.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    run.add_argument("--verbose", "-v", action="store_true", help="log every batch (key=value lines on stderr)")
    search = commands.add_parser("search", help="nearest neighbours of a query in the job's collection")
    search.add_argument("manifest", type=Path)
    search.add_argument("query")
    search.add_argument("-k", type=int, default=5, help="how many neighbours (default 5)")
    search.add_argument("--database-url", default=os.environ.get(DATABASE_URL_ENV))
    job_logs.add_command(commands)
    render.add_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _quiet_third_party_notices()
    if args.command == job_logs.COMMAND:
        return job_logs.run(args)
    if args.command == render.COMMAND:
        return render.run(args)
    try:
        config = JobConfig.from_file(args.manifest)
    except (SpecError, OSError) as exc:
        print(f"embedjob: invalid manifest {args.manifest}: {exc}", file=sys.stderr)
        return ExitCode.INVALID_CONFIG
    with ExitStack() as stack:
        url = args.database_url or _local_database(stack)
        # Log lines go above `embedjob run`'s progress bar, never into it.
        configure_logging(secrets=[url], level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                          write=lambda line: tqdm.write(line, file=sys.stderr))
        try:
            return _run(config, url, args) if args.command == "run" else _search(config, url, args)
        except Unreachable as exc:
            print(f"embedjob: {exc}", file=sys.stderr)
            return unreachable_exit_code(exc)


def _local_database(stack: ExitStack) -> str:
    from .localdb import start_local_database

    server, url = start_local_database()
    stack.callback(server.cleanup)
    return url


def _run(config: JobConfig, url: str, args: argparse.Namespace) -> int:
    import ray

    from .batching import estimated_batches
    from .driver import fault_injection_from_env
    from .metrics import DriverMetrics
    from .run import DriverOptions, run_job
    from .source import count_records, resolve_uri

    workers = config.spec.workers
    needed_cpus = workers.replicas * workers.cpus_per_actor
    # address="local": a fresh Ray on this machine even when RAY_ADDRESS points elsewhere.
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, int(needed_cpus + 0.999)),
             include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    metrics = DriverMetrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    spec = config.spec
    try:
        total = count_records(resolve_uri(spec.source.uri, config.base_dir), spec.source.format)
    except OSError:
        total = None  # the driver refuses the job with SourceUnavailable and says why
    # Until the input has been read through, the batch count is estimated from the records.
    estimate = f"~{estimated_batches(total, spec.batching.batch_size, spec.batching.sort_window)}" if total else "?"
    print(f"embedjob: {config.name}: {spec.source.uri} -> {mask_url(url)} table {spec.sink.table}, "
          f"collection {spec.sink.collection}", file=sys.stderr)
    with tqdm(total=total, unit="rec", desc=config.name, dynamic_ncols=True) as bar:
        def show(counters: RunCounters) -> None:
            bar.update(counters.records_embedded + counters.records_failed - bar.n)
            known = counters.batches_total if counters.batches_total is not None else estimate
            batches = f"{counters.batches_succeeded + counters.batches_failed}/{known}"
            bar.set_postfix(batches=batches, texts_s=counters.texts_per_second, refresh=False)

        options = DriverOptions(new_run=args.new_run, metrics=metrics, on_progress=show,
                                fault_injection=fault_injection_from_env())
        try:
            summary = run_job(config, url, options)
        finally:
            ray.shutdown()
    _print_summary(summary)
    return ExitCode.SUCCEEDED if summary.state == "succeeded" else ExitCode.JOB_FAILED


def _print_summary(summary) -> None:
    c = summary.counters
    lines = [f"state              {summary.state}" + (f" ({summary.reason}: {summary.error})" if summary.reason else "")]
    if c is not None:
        lines += [
            f"records embedded   {c.records_embedded} ({summary.records_truncated} truncated)",
            f"records failed     {c.records_failed}",
            f"batches            {c.batches_succeeded} succeeded ({summary.batches_skipped} already done),"
            f" {c.batches_failed} failed, {c.batches_total} total",
            f"throughput         {c.texts_per_second:.1f} texts/s",
            f"batch latency      p50 {summary.latency_percentile(0.5):.2f}s, p95 {summary.latency_percentile(0.95):.2f}s",
            f"model load         {summary.model_load_seconds:.1f}s",
            f"retries            {summary.retries} ({summary.oom_splits} out-of-memory splits)",
            f"elapsed            {summary.elapsed_seconds:.1f}s (run {summary.run_id})",
        ]
    print("\n".join(lines))


def _search(config: JobConfig, url: str, args: argparse.Namespace) -> int:
    import sqlalchemy as sa
    from transformers.utils import logging as transformers_logging

    from .exported import export_model
    from .model import load_model, resolve_model

    transformers_logging.disable_progress_bar()  # no "Loading weights" bar before the answer
    try:
        resolved = resolve_model(config.spec.model)
    except (OSError, ValueError) as exc:
        print(f"embedjob: spec.model: {exc}", file=sys.stderr)
        return ExitCode.INVALID_CONFIG
    # The query is embedded like the vectors: same backend, precision and export (from this machine's cache).
    model = load_model(resolved, "cpu", export_model(resolved) if resolved.exported else None)
    query = model.encode([args.query], normalize_embeddings=True, convert_to_numpy=True)[0].astype("float32")
    vector = "[" + ",".join(f"{x:.7g}" for x in query) + "]"
    engine = db.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                f'SELECT record_id, embedding <=> CAST(:q AS vector) AS distance, text FROM "{config.spec.sink.table}"'
                " WHERE collection = :c AND model = :m AND revision = :r ORDER BY distance LIMIT :k"),
                {"q": vector, "c": config.spec.sink.collection, "m": resolved.name, "r": resolved.revision,
                 "k": args.k}).all()
    except sa.exc.OperationalError as exc:
        raise Unreachable(f"cannot reach the database: {str(exc.orig).splitlines()[0]}") from None
    except sa.exc.ProgrammingError:
        print(f"embedjob: no vectors yet: run `embedjob run {args.manifest}` first", file=sys.stderr)
        return ExitCode.JOB_FAILED
    finally:
        engine.dispose()
    sink = config.spec.sink
    if not rows:
        print(f"embedjob: no vectors in collection {sink.collection!r} of table {sink.table} for "
              f"{resolved.name}@{resolved.revision}: run `embedjob run {args.manifest}` first", file=sys.stderr)
        return ExitCode.JOB_FAILED
    print("distance  id  snippet")  # cosine distance: 0 is the same direction, 2 the opposite
    for record_id, distance, text in rows:
        snippet = " ".join(text.split())
        snippet = snippet if len(snippet) <= SNIPPET_CHARS else snippet[: SNIPPET_CHARS - 1] + "…"
        print(f"{distance:.4f}  {record_id}  {snippet}")
    return ExitCode.SUCCEEDED
