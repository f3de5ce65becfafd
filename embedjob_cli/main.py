"""The `embedjob` command: `run` (a job on this machine: local Ray, embedded PostgreSQL), `search`, `logs`, `render`."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

# `embedjob run` is a one-machine Ray: keep its servers on loopback rather than the
# machine's network address. Ray reads this once, when it is first imported (below).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from tqdm import tqdm  # noqa: E402

from embedjob import db  # noqa: E402
from embedjob.api import IndexType, RunCounters, SpecError, VectorIndex  # noqa: E402
from embedjob.contract import DATABASE_URL_ENV, SOURCE_DATABASE_URL_ENV, ExitCode  # noqa: E402

from embedjob_worker.core.config import JobConfig  # noqa: E402
from embedjob_worker.core.errors import JobFailed, Unreachable, unreachable_exit_code  # noqa: E402
from embedjob_cli import job_logs, model_revision, render, search_command  # noqa: E402
from embedjob_cli.noise import quiet_libraries  # noqa: E402
from embedjob_worker.core.logs import configure_logging, log_event, mask_secrets, mask_url  # noqa: E402
from embedjob_cli.search import nearest, revision_refusal, searchable_vector_type  # noqa: E402
from embedjob_worker.sink.target import SinkTarget  # noqa: E402
from embedjob_worker.sink.vector_index import metric_for  # noqa: E402

SNIPPET_CHARS = 100
log = logging.getLogger("embedjob_cli.main")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embedjob", description="Batch text embeddings on Ray into PostgreSQL.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run an EmbeddingJob manifest on this machine (local Ray)")
    run.add_argument("manifest", type=Path)
    run.add_argument("--database-url", default=os.environ.get(DATABASE_URL_ENV),
                     help=f"PostgreSQL URL (default: ${DATABASE_URL_ENV}, else an embedded PostgreSQL)")
    run.add_argument("--new-run", action="store_true", help="start a new run although the input changed")
    run.add_argument("--source-database-url", default=os.environ.get(SOURCE_DATABASE_URL_ENV),
                     help="PostgreSQL URL of a table source's database (default: "
                     f"${SOURCE_DATABASE_URL_ENV}, else the sink's database)")
    run.add_argument("--ray-address", metavar="HOST:PORT",
                     help="run on a Ray you started (`ray start --head`) instead of starting one for this run, which "
                          "takes seconds; its workers must see the job's files and environment as this machine does")
    run.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    run.add_argument("--verbose", "-v", action="store_true", help="log every batch (key=value lines on stderr) "
                     "and what the libraries print on their own (silenced otherwise)")
    run.add_argument("--index", choices=[t.value for t in IndexType],
                     help="build this vector index after the run (default: the manifest's spec.sink.index, else none)")
    run.add_argument("--max-tokens", type=int, metavar="N",
                     help="token budget per batch: overrides spec.batching.maxTokens (docs/token-budget.md)")
    run.add_argument("--chunk-max-tokens", type=int, metavar="N",
                     help="cut long texts into chunks of N tokens, one vector each: sets spec.chunking.maxTokens "
                     "(docs/chunking.md)")
    run.add_argument("--chunk-overlap-tokens", type=int, metavar="N",
                     help="tokens a chunk repeats from the one before: sets spec.chunking.overlapTokens (turns "
                     "chunking on)")
    search_command.add_command(commands)
    job_logs.add_command(commands)
    render.add_command(commands)
    model_revision.add_command(commands)
    return parser


def _with_index(config: JobConfig, index: str | None) -> JobConfig:
    """The config with `embedjob run --index` in place of spec.sink.index (the manifest's HNSW parameters kept)."""
    sink = config.spec.sink
    if index is None or (index == IndexType.hnsw and sink.hnsw):
        return config
    sink = sink.model_copy(update={"index": VectorIndex(type=index)})
    return dataclasses.replace(config, spec=config.spec.model_copy(update={"sink": sink}))


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = _parser().parse_args(argv)
    verbose = getattr(args, "verbose", False)
    quiet_libraries(verbose)
    if args.command == job_logs.COMMAND:
        return job_logs.run(args)
    if args.command == render.COMMAND:
        return render.run(args)
    if args.command == model_revision.COMMAND:
        return model_revision.run(args)
    try:
        config = _with_index(JobConfig.from_file(args.manifest), getattr(args, "index", None))
        if getattr(args, "max_tokens", None) is not None:
            config = config.with_max_tokens(args.max_tokens)
        chunk_flags = (getattr(args, "chunk_max_tokens", None), getattr(args, "chunk_overlap_tokens", None))
        if chunk_flags != (None, None):
            config = config.with_chunking(*chunk_flags)
    except (SpecError, OSError) as exc:
        print(f"embedjob: invalid manifest {args.manifest}: {exc}", file=sys.stderr)
        return ExitCode.INVALID_CONFIG
    with ExitStack() as stack:
        # Log lines go above `embedjob run`'s progress bar, never into it. The embedded PostgreSQL's
        # URL holds no password (a Unix socket in its own directory): the secrets are the URLs given.
        secrets = [args.database_url or "", getattr(args, "source_database_url", None) or ""]
        configure_logging(secrets=secrets, level=logging.INFO if verbose else logging.WARNING,
                          write=lambda line: tqdm.write(line, file=sys.stderr), names=("embedjob_worker", "embedjob_cli"))
        url = (lambda: args.database_url) if args.database_url else _local_database(stack, started)
        try:
            return _run(config, url, args, started) if args.command == "run" else _search(config, url, args)
        except Unreachable as exc:
            print(f"embedjob: {mask_secrets(str(exc))}", file=sys.stderr)
            return unreachable_exit_code(exc)


def _local_database(stack: ExitStack, started: float) -> Callable[[], str]:
    """Start the embedded PostgreSQL in a thread, so that Ray (`run`) or the model (`search`) starts meanwhile;
    returns what waits for its URL. It is stopped when `stack` closes."""
    from embedjob_cli.localdb import start_local_database

    def start():
        server, url = start_local_database()
        log_event(log, "local_database_ready", seconds=round(time.monotonic() - started, 2))
        return server, url

    starting = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="localdb")).submit(start)
    stack.callback(_stop_local_database, starting)  # before the pool's exit, which would wait for it anyway
    return lambda: starting.result()[1]


def _stop_local_database(starting: Future) -> None:
    if starting.exception() is None:  # waits for the start: a server half started is stopped too
        starting.result()[0].cleanup()


def _run(config: JobConfig, database_url: Callable[[], str], args: argparse.Namespace, started: float) -> int:
    import ray

    from embedjob_worker.plan.batching import estimated_batches
    from embedjob_worker.driver import connect_ray, fault_injection_from_env
    from embedjob_worker.core.metrics import DriverMetrics
    from embedjob_worker.encode.tokens import prewarm_tokenizer
    from embedjob_worker.run.job import DriverOptions, run_job
    from embedjob_worker.source.files import count_records, resolve_uri
    from embedjob_worker.source.table import table_uri

    prewarm_tokenizer(config.spec)  # a first start's tokenizer build overlaps Ray's start
    if args.ray_address:
        connect_ray(args.ray_address, log_to_driver=False)  # that Ray only: never a local one instead
    else:  # address="local": a fresh Ray on this machine even when RAY_ADDRESS points elsewhere.
        workers = config.spec.workers
        needed_cpus = workers.replicas * workers.cpus_per_actor
        ray.init(address="local", num_cpus=max(os.cpu_count() or 1, int(needed_cpus + 0.999)),
                 include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    log_event(log, "ray_ready", seconds=round(time.monotonic() - started, 2))
    url = database_url()
    metrics = DriverMetrics()
    metrics.serve(args.metrics_port)
    spec = config.spec
    try:
        # A table's rows are not counted ahead (a view may be costly to read twice): the bar counts up.
        total = None if spec.source.table else count_records(resolve_uri(spec.source.uri, config.base_dir),
                                                              spec.source.format)
    except OSError:
        total = None  # the driver refuses the job with SourceUnavailable and says why
    # Until the input has been read through, the batch count is estimated from the records.
    # With a token budget the count depends on the texts' tokens: unknown until read through.
    chosen = spec.chosen_batching
    estimate = (f"~{estimated_batches(total, chosen.batch_size, spec.batching.sort_window)}"
                if total and chosen.max_tokens is None and spec.chunking is None else "?")
    source = table_uri(spec.source.table) if spec.source.table else spec.source.uri
    print(f"embedjob: {config.name}: {source} -> {mask_url(url)} table {spec.sink.table}, "
          f"collection {spec.sink.collection}", file=sys.stderr)
    with tqdm(total=total, unit="rec", desc=config.name, dynamic_ncols=True) as bar:
        def show(counters: RunCounters) -> None:
            bar.update(counters.records_embedded + counters.records_failed - bar.n)
            known = counters.batches_total if counters.batches_total is not None else estimate
            batches = f"{counters.batches_succeeded + counters.batches_failed}/{known}"
            bar.set_postfix(batches=batches, texts_s=counters.texts_per_second, refresh=False)

        options = DriverOptions(new_run=args.new_run, metrics=metrics, on_progress=show,
                                fault_injection=fault_injection_from_env(),
                                source_database_url=args.source_database_url)
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
            f"chunks embedded    {c.chunks_embedded} (vectors the model embedded in this run)",
            f"records failed     {c.records_failed}",
            f"records by content {c.records_new} new, {c.records_changed} changed, {c.records_unchanged} unchanged"
            + (f" ({summary.metadata_updated} with new metadata only)" if summary.metadata_updated else "")
            + f", {c.records_deleted} deleted",
            f"batches            {c.batches_succeeded} succeeded ({summary.batches_skipped} already done),"
            f" {c.batches_failed} failed, {c.batches_total} total",
            f"batching           {summary.batching}",
            f"document prompt    {summary.prompt}",
            f"throughput         {c.texts_per_second:.1f} texts/s",
            f"batch latency      p50 {summary.latency_percentile(0.5):.2f}s, p95 {summary.latency_percentile(0.95):.2f}s",
            f"model load         {summary.model_load_seconds:.1f}s",
            f"retries            {summary.retries} ({summary.oom_splits} out-of-memory splits)",
            f"elapsed            {summary.elapsed_seconds:.1f}s (run {summary.run_id})",
        ]
    if summary.change_window is not None:
        lines.append(f"rows read          {summary.change_window.described()}")
    if c is not None and c.precision_cosine_mean is not None:
        lines.append(f"precision check    cosine to float32: mean {c.precision_cosine_mean:.4f}, least "
                     f"{c.precision_cosine_min:.4f} (spec.model.minCosine)")
    for kind, built in (("vector index      ", summary.index), ("metadata index    ", summary.metadata_index)):
        if built is not None:
            lines.append(f"{kind} {built.name} " + (f"built in {built.seconds:.1f}s" if built.built else
                                                    "exists (not rebuilt)") + (f"; {built.note}" if built.note else ""))
    print("\n".join(lines))


def _query_vector(resolved, args: argparse.Namespace):
    """The query embedded like the vectors: same backend, precision, export (from this machine's cache) and
    dimensions, after the query prompt (model_card.query_prompt: as encode_query picks it)."""
    from transformers.utils import logging as transformers_logging

    from embedjob_worker.encode.exported import load_on_this_machine
    from embedjob_worker.encode.model_card import model_prompts, query_prompt

    transformers_logging.disable_progress_bar()  # no "Loading weights" bar before the answer
    model = load_on_this_machine(resolved)
    prompt = args.prompt if args.prompt is not None else query_prompt(model_prompts(resolved.location,
                                                                                    resolved.hub_revision))
    return model.encode([args.query], prompt=prompt, truncate_dim=resolved.dimensions, normalize_embeddings=True,
                        convert_to_numpy=True)[0].astype("float32")


def _search(config: JobConfig, database_url: Callable[[], str], args: argparse.Namespace) -> int:
    import sqlalchemy as sa

    from embedjob_worker.encode.model import resolve_model

    try:
        resolved = resolve_model(config.spec.model)
    except (OSError, ValueError) as exc:
        print(f"embedjob: spec.model: {exc}", file=sys.stderr)
        return ExitCode.INVALID_CONFIG
    except JobFailed as exc:  # a prompt the model does not declare, a backend that cannot take it
        print(f"embedjob: {exc}", file=sys.stderr)
        return ExitCode.INVALID_CONFIG
    engine = db.create_engine(database_url())
    try:
        # the table the job's runs write: in the schema the role creates tables in, never found through the search path
        target = SinkTarget.of_job(config).in_schema_of(engine)
        with engine.connect() as conn:
            refusal = None if args.incoming else revision_refusal(conn, target.vectors, target.collection,
                                                                  resolved.name, resolved.revision)
            readable = refusal is None and searchable_vector_type(conn, target.vectors, args.where) is not None
        hits = None
        # The model loads (seconds) only for a search that reads, and in no transaction: a refusal comes at once.
        if readable:
            query = _query_vector(resolved, args)
            with engine.connect() as conn:
                hits = nearest(conn, target.vectors, target.collection, resolved.name, resolved.revision, query,
                               args.k, metric_for(config.spec.model.normalize), args.ef_search, args.where)
    except sa.exc.OperationalError as exc:
        raise Unreachable(f"cannot reach the database: {str(exc.orig).splitlines()[0]}") from None
    except (ValueError, JobFailed) as exc:  # no schema; a table search cannot read (another vector type, pre-chunking)
        print(f"embedjob: {exc}", file=sys.stderr)
        return ExitCode.JOB_FAILED
    finally:
        engine.dispose()
    if refusal:
        print(f"embedjob: {refusal}", file=sys.stderr)
        return ExitCode.JOB_FAILED
    if hits is None:
        print(f"embedjob: no vectors yet: run `embedjob run {args.manifest}` first", file=sys.stderr)
        return ExitCode.JOB_FAILED
    if not hits:
        print(f"embedjob: no vectors in collection {target.collection!r} of table {target.vectors} for "
              f"{resolved.name}@{resolved.revision}: run `embedjob run {args.manifest}` first", file=sys.stderr)
        return ExitCode.JOB_FAILED
    # cosine distance: 0 is the same direction, 2 the opposite; chars: the chunk's offsets into the record's text
    print("distance  id  chunk  chars  snippet")
    for hit in hits:
        snippet = " ".join(hit.text.split())
        snippet = snippet if len(snippet) <= SNIPPET_CHARS else snippet[: SNIPPET_CHARS - 1] + "…"
        print(f"{hit.distance:.4f}  {hit.record_id}  {hit.chunk}  {hit.char_start}-{hit.char_end}  {snippet}")
    return ExitCode.SUCCEEDED
