"""Counting texts' tokens in the driver with the job model's own tokenizer, for token-budget batches.

Only the tokenizer is loaded (not the weights): the driver plans batches, the actors
embed them. A count is what the model's forward pass pads to: the text stripped as
sentence-transformers strips it, with the special tokens, capped at the model's limit.
"""

from __future__ import annotations

import json
from pathlib import Path

from .batching import TokenBudget
from .errors import JobFailed
from .model import ResolvedModel


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


class TokenCounter:
    """Callable: texts -> their token counts, each at most `limit`."""

    def __init__(self, resolved: ResolvedModel, limit: int | None):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_location(resolved.location),
                                                       revision=resolved.hub_revision)
        self.limit = limit or self.tokenizer.model_max_length

    def __call__(self, texts: list[str]) -> list[int]:
        encoded = self.tokenizer([t.strip() for t in texts], add_special_tokens=True, truncation=True,
                                 max_length=self.limit, return_attention_mask=False, return_token_type_ids=False,
                                 verbose=False)["input_ids"]
        return [len(ids) for ids in encoded]


def token_budget(max_tokens: int | None, resolved: ResolvedModel, limit: int | None) -> TokenBudget | None:
    """The job's token budget (None without spec.batching.maxTokens); `limit` is the model's
    token limit (model_token_limit; None: the tokenizer's)."""
    if max_tokens is None:
        return None
    try:
        return TokenBudget(max_tokens, TokenCounter(resolved, limit))
    except (OSError, ValueError) as exc:
        raise JobFailed("ModelUnavailable", f"spec.batching.maxTokens needs the model's tokenizer in the driver: "
                                            f"{type(exc).__name__}: {exc}") from None
