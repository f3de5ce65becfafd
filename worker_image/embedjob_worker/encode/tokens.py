"""The job model's own tokenizer in the driver: token counts for token-budget batches, and the chunker.

Only the tokenizer is loaded (not the weights): the driver plans batches and chunks, the
actors embed them. A count is what the model's forward pass pads to: the text stripped as
sentence-transformers strips it, with the special tokens, capped at the model's limit.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from embedjob.api import Chunking, EmbeddingJobSpec

from embedjob_worker.plan.batching import TokenBudget
from embedjob_worker.plan.chunking import Chunker
from embedjob_worker.plan.counting import TokenCount
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.logs import log_event
from embedjob_worker.encode.model import ResolvedModel, local_model_dir
from embedjob_worker.encode.tokenizer_cache import keep_tokenizer, kept_tokenizer, tokenizer_entry

log = logging.getLogger("embedjob_worker.encode.tokens")
# A model whose tokenizer states no limit (model_max_length is then a huge number) gets no default chunk size.
_LARGEST_DEFAULT_CHUNK = 8192


def tokenizer_location(model_location: str) -> str:
    """Where the tokenizer of a sentence-transformers model lives: its Transformer module's
    directory (modules.json), the model directory itself, or the hub id unchanged."""
    directory = Path(model_location)
    modules_file = directory / "modules.json"
    if not modules_file.is_file():
        return model_location
    for module in json.loads(modules_file.read_text()):
        if module.get("type", "").endswith(".Transformer"):
            return str(directory / module.get("path", ""))
    return model_location


def model_token_limit(resolved: ResolvedModel) -> int | None:
    """The token limit the actors will load the model with, read without loading it: the job's
    maxSeqLength, else the model's sentence_bert_config.json; None when neither says (the
    tokenizer's own limit then applies). Read in the driver because batches are planned before
    any actor starts (an unchanged incremental re-run starts none)."""
    if resolved.max_seq_length:
        return resolved.max_seq_length
    config = Path(resolved.location) / "sentence_bert_config.json"
    try:
        limit = json.loads(config.read_text()).get("max_seq_length")
    except (OSError, ValueError, AttributeError):
        return None
    return limit if isinstance(limit, int) and limit > 0 else None


def load_tokenizer(resolved: ResolvedModel):
    """The model's tokenizer, without the weights: as kept by an earlier start on this machine
    (encode.tokenizer_cache), else built by transformers' AutoTokenizer (and kept)."""
    return _tokenizer_at(resolved.location, resolved.hub_revision)


# One build at a time in a process: a start that needs the tokenizer while prewarm_tokenizer's thread builds it
# waits for that build and then reads what it kept, rather than building it a second time beside it.
_building = threading.Lock()


def _tokenizer_at(model_location: str, hub_revision: str | None):
    location = tokenizer_location(model_location)
    with _building:
        entry = tokenizer_entry(location, hub_revision)  # the folder's files read once, for both ways
        kept = kept_tokenizer(entry) if entry is not None else None
        if kept is not None:
            return kept
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(location, revision=hub_revision)
        if entry is not None:
            keep_tokenizer(entry, tokenizer)
        return tokenizer


def prewarm_tokenizer(spec: EmbeddingJobSpec) -> threading.Thread | None:
    """Build and keep, in a thread of its own, the tokenizer of a job that plans by tokens (a token budget or
    chunking) when its model is a local folder (a path or a package), so that a first start on a machine (about
    5 s of transformers and torch imports) overlaps Ray's start instead of following it. None when there is
    nothing to build ahead; a failure here is left to the run's own load, which says what went wrong."""
    model = spec.model
    if (spec.chosen_batching.max_tokens is None and spec.chunking is None) or not (model.path or model.package):
        return None

    def build() -> None:
        started = time.monotonic()
        try:
            _tokenizer_at(str(local_model_dir(model)), None)
        except Exception as exc:  # noqa: BLE001 - the run loads it again and reports its own error
            log_event(log, "tokenizer_prewarm_failed", logging.DEBUG, error=f"{type(exc).__name__}: {exc}"[:300])
            return
        log_event(log, "tokenizer_ready", seconds=round(time.monotonic() - started, 2))

    thread = threading.Thread(target=build, name="tokenizer-prewarm", daemon=True)
    thread.start()
    return thread


class TokenCounter:
    """Callable: texts -> their token counts as the model sees them (after the job's document prompt), each at
    most `limit`: by the fast tokenizer's Rust backend (plan.counting.TokenCount), else (a tokenizer without
    one) by the transformers tokenizer's own call."""

    def __init__(self, resolved: ResolvedModel | None, limit: int | None, tokenizer=None):
        """`resolved` None: the tokenizer given, and no prompt."""
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(resolved)
        self.limit = limit or self.tokenizer.model_max_length
        self.prompt = resolved.prompt.text if resolved is not None else ""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        self.fast = TokenCount(backend, self.limit) if backend is not None else None

    def __call__(self, texts: list[str]) -> list[int]:
        """Each text after the prompt, stripped as sentence-transformers strips it, counted with the special
        tokens."""
        prompted = [(self.prompt + t).strip() for t in texts]
        return self.fast(prompted) if self.fast is not None else self.called(prompted)

    def called(self, texts: list[str]) -> list[int]:
        """The counts by the transformers tokenizer's call, as the model's forward pass tokenizes (stripped)."""
        encoded = self.tokenizer([t.strip() for t in texts], add_special_tokens=True, truncation=True,
                                 max_length=self.limit, return_attention_mask=False, return_token_type_ids=False,
                                 verbose=False)["input_ids"]
        return [len(ids) for ids in encoded]


def token_budget(max_tokens: int | None, resolved: ResolvedModel, limit: int | None,
                 tokenizer=None) -> TokenBudget | None:
    """The job's token budget (None: fixed batches; spec.chosen_batching's max_tokens); `limit` is the model's
    token limit (model_token_limit; None: the tokenizer's). `tokenizer`: one already loaded."""
    if max_tokens is None:
        return None
    try:
        return TokenBudget(max_tokens, TokenCounter(resolved, limit, tokenizer))
    except (OSError, ValueError) as exc:
        # The budget may be the default one, which the user never asked for: say how to go without it.
        raise _no_tokenizer("spec.batching.maxTokens (set, or the default budget; batchSize alone: fixed batches, "
                            "no tokenizer)", exc) from None


def prompt_tokens(tokenizer, prompt: str) -> int:
    """The tokens a document prompt adds before each text (without the special ones, which the text's count
    has). Counted apart: exact where the prompt ends in a space or punctuation, as the common ones do."""
    if not prompt.strip():
        return 0
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # counted as the texts are (a copy of the pipeline that neither pads nor truncates)
        counter = TokenCount(backend, None)
        return counter([prompt.strip()])[0] - counter.specials
    return len(tokenizer(prompt.strip(), add_special_tokens=False, verbose=False)["input_ids"])


def _no_tokenizer(field: str, exc: Exception) -> JobFailed:
    return JobFailed("ModelUnavailable", f"{field} needs the model's tokenizer in the driver: {type(exc).__name__}: "
                                         f"{exc}")


def chunker_for(chunking: Chunking | None, resolved: ResolvedModel, limit: int | None, tokenizer=None) -> Chunker | None:
    """The job's chunker (None without spec.chunking), chunks of at most `limit` tokens (model_token_limit;
    None: the tokenizer's); refused (ChunkingUnsupported) naming the field when the model cannot take them."""
    if chunking is None:
        return None
    try:
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(resolved)
    except (OSError, ValueError) as exc:
        raise _no_tokenizer("spec.chunking", exc) from None
    stated = limit is not None or tokenizer.model_max_length <= _LARGEST_DEFAULT_CHUNK
    limit = limit or tokenizer.model_max_length
    if chunking.max_tokens is None and not stated:
        raise JobFailed("ChunkingUnsupported", f"spec.chunking.maxTokens: model {resolved.name} states no token limit; "
                                               "set maxTokens (or model.maxSeqLength)")
    prompt = prompt_tokens(tokenizer, resolved.prompt.text)
    max_tokens = chunking.max_tokens or limit - prompt
    if max_tokens + prompt > limit:
        with_prompt = f" with the document prompt's {prompt} tokens before each chunk" if prompt else ""
        raise JobFailed("ChunkingUnsupported", f"spec.chunking.maxTokens: {max_tokens}{with_prompt} is more than "
                                               f"model {resolved.name}'s token limit {limit}; the model would truncate "
                                               f"the chunks: set at most {limit - prompt}")
    if not getattr(tokenizer, "is_fast", False):
        raise JobFailed("ChunkingUnsupported", f"spec.chunking: model {resolved.name} has no fast tokenizer "
                                               "(tokenizer.json), which the chunks' character offsets come from")
    try:
        return Chunker(tokenizer.backend_tokenizer, max_tokens, chunking.overlap_tokens, prompt)
    except ValueError as exc:
        raise JobFailed("ChunkingUnsupported", f"spec.chunking.overlapTokens: {exc}") from None
