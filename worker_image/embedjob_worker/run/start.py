"""The start of a job's run: migrations, the model and input resolved, the token plan, the run started or resumed."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from embedjob import schema

from embedjob_worker.core.change_window import ChangeWindow, window_for
from embedjob_worker.core.config import JobConfig, config_fingerprint, run_identity
from embedjob_worker.core.errors import JobFailed, Unreachable
from embedjob_worker.core.logs import log_event
from embedjob_worker.encode.model import ResolvedModel, described_prompt, resolve_model
from embedjob_worker.encode.model_card import trained_for_truncation
from embedjob_worker.encode.tokens import chunker_for, load_tokenizer, model_token_limit, token_budget
from embedjob_worker.plan.batching import TokenBudget, batch_key
from embedjob_worker.plan.chunking import Chunker
from embedjob_worker.sink.incremental import latest_run_succeeded
from embedjob_worker.sink.listings import StoredListing
from embedjob_worker.sink.runs import JobRuns, RunRequest, RunStart
from embedjob_worker.source.dataset import DatasetSnapshot, dataset_snapshot, is_dataset
from embedjob_worker.source.files import resolve_uri
from embedjob_worker.source.snapshot import InputSnapshot, input_snapshot
from embedjob_worker.source.table import table_snapshot, table_uri
from embedjob_worker.source.unavailable import in_a_store, store_unavailable

log = logging.getLogger("embedjob_worker.run.start")


@dataclass(frozen=True)
class StartedRun:
    """A run started or resumed, and what its batches are made with."""

    start: RunStart
    resolved: ResolvedModel
    uri: str  # where the input is read (a table source's: table_uri)
    key: str  # batch ids derive from it: the input's and the config's fingerprints (batching.batch_key)
    budget: TokenBudget | None  # spec.batching.maxTokens, or its default (spec.chosen_batching)
    chunker: Chunker | None  # spec.chunking
    files: Sequence[InputSnapshot]  # a dataset's files as listed at the start (empty: one file, or a table)
    window: ChangeWindow | None = None  # a table read by its change column (core.change_window)


def migrate(database_url: str) -> None:
    """The bookkeeping tables at the newest schema: Unreachable without the database, JobFailed (SchemaBehind)
    when this role may not migrate them."""
    try:
        schema.migrate(database_url)
    except sa.exc.OperationalError as exc:
        raise Unreachable(f"cannot reach the database: {str(exc.orig).splitlines()[0]}") from None
    except schema.SchemaBehind as exc:  # a namespace role may not migrate: an admin must (docs/install.md)
        raise JobFailed("SchemaBehind", str(exc)) from None


def start_run(config: JobConfig, runs: JobRuns, new_run: bool) -> StartedRun:
    """Resolve the model's revision and the input, plan tokens, then start or resume the run (a new one with
    `new_run`). JobFailed when it may not start; a missing model or input, or a model that cannot take the
    token plan, is recorded as a refused start."""
    spec = config.spec
    try:
        resolved, uri, snapshot = _resolve_inputs(config, runs)
        budget, chunker = _token_plan(config, resolved)
    except JobFailed as failure:
        runs.refuse_start(spec.model.name, failure)
        raise
    identity = run_identity(spec, resolved.revision, resolved.prompt.text)
    config_fp = config_fingerprint(identity)
    input_fp = snapshot.fingerprint  # once: a dataset's is a hash over its whole listing
    # A table's rows change by design: each sync after a finished one is a run of its own (docs/table-source.md).
    new_run = new_run or (spec.source.table is not None and latest_run_succeeded(runs.engine, config.job_key))
    start = runs.start(RunRequest(resolved.name, resolved.revision, input_fp, config_fp, identity,
                                  snapshot.record(), described_prompt(resolved)), new_run, config.how_to_start_anew)
    files = snapshot.files if isinstance(snapshot, DatasetSnapshot) else ()
    window = window_for(spec.source.table, spec.sync, (input_fp, config_fp), start.revision_state,
                        start.previous, start.resumed)
    if window is not None:
        runs.record_window(start.run, window)
    return StartedRun(start, resolved, uri, batch_key(input_fp, config_fp), budget, chunker, files,
                      window)


def _resolve_inputs(config: JobConfig, runs: JobRuns) -> tuple[ResolvedModel, str, InputSnapshot | DatasetSnapshot]:
    """Model revision, the input's location and its snapshot (fingerprint): a dataset's lists its files into the
    database (sink.listings). A model cut to fewer dimensions whose card does not say it was trained for that is
    warned about, not refused."""
    spec = config.spec
    table = spec.source.table
    uri = table_uri(table) if table else resolve_uri(spec.source.uri, config.base_dir)
    try:
        resolved = resolve_model(spec.model)
    except JobFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - as the source's below, for a model from storage (spec.model.uri)
        if not isinstance(exc, (OSError, ValueError)) and not in_a_store(spec.model.uri or ""):
            raise
        raise store_unavailable("ModelUnavailable", "spec.model", spec.model.uri or "", exc) from None
    if resolved.dimensions is not None and not trained_for_truncation(resolved.location, resolved.hub_revision):
        log_event(log, "dimensions_without_matryoshka", logging.WARNING, dimensions=resolved.dimensions,
                  model=resolved.name, note="the model's card does not say it was trained for truncation "
                  "(MatryoshkaLoss): its first dimensions may keep less of its quality than a Matryoshka model's")
    try:
        if table:
            return resolved, uri, table_snapshot(table, spec.source.template)
        if is_dataset(uri):
            listing = StoredListing(runs.engine, runs.target.job_key, runs.namespace)
            return resolved, uri, dataset_snapshot(uri, spec.source.format, listing)
        return resolved, uri, input_snapshot(uri)
    except Exception as exc:  # noqa: BLE001 - a store's SDK raises its own errors too, not only OSError
        if not isinstance(exc, (OSError, ValueError)) and not in_a_store(uri):
            raise
        raise store_unavailable("SourceUnavailable", f"spec.source {uri}", uri, exc) from None


def _token_plan(config: JobConfig, resolved: ResolvedModel) -> tuple[TokenBudget | None, Chunker | None]:
    """The token budget and the chunker the spec asks for (one tokenizer for both); JobFailed when the model
    cannot take them."""
    spec, limit = config.spec, model_token_limit(resolved)
    max_tokens = spec.chosen_batching.max_tokens
    try:
        tokenizer = load_tokenizer(resolved) if max_tokens is not None and spec.chunking is not None else None
        return (token_budget(max_tokens, resolved, limit, tokenizer),
                chunker_for(spec.chunking, resolved, limit, tokenizer))
    except (OSError, ValueError) as exc:
        raise JobFailed("ModelUnavailable", f"spec.model: the tokenizer: {type(exc).__name__}: {exc}") from None
