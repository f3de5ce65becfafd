"""Counting the tokens the model sees in texts, by its `tokenizers.Tokenizer`, at a few µs of CPU a text.

A count is len(input_ids) of the text, special tokens included, capped at a limit
(truncation), as the tokenizer's encode gives it. The tokenizer's full pipeline keeps
character alignments for every step, most of its cost (bench/token_budget.py --counting-only). For a
BERT-style tokenizer (BertNormalizer cleaning text, BertPreTokenizer, WordPiece) a plain
text (ASCII, no control characters other than tab and line ends, no added token in it) is
counted without it: the pre-tokenizer's words are found by one regular expression (runs
without white space or ASCII punctuation, and each punctuation character), and each
distinct word's WordPiece count is asked of the model once and remembered. Every other
text, and every text of another tokenizer, goes through the pipeline, one text a call. The
counts are the same either way (tests/unit/test_token_counting.py).
"""

from __future__ import annotations

import json
import re
import string
from typing import Any

_WORD = re.compile(rf"[^\s{re.escape(string.punctuation)}]+|[{re.escape(string.punctuation)}]")
# Control characters BertNormalizer drops (so joining the words around them); tab and line ends are white space.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# The word counts kept (then forgotten all at once), of words this long at most: a few tens of MB.
_REMEMBERED_WORDS, _LONGEST_REMEMBERED = 1 << 18, 64


class _WordPieces(dict):
    """word -> how many WordPiece tokens the model cuts it into, asked of the model once per (short) word."""

    def __init__(self, model: Any):
        super().__init__()
        self.model = model

    def __missing__(self, word: str) -> int:
        count = len(self.model.tokenize(word))
        if len(word) <= _LONGEST_REMEMBERED:
            if len(self) >= _REMEMBERED_WORDS:
                self.clear()
            self[word] = count
        return count


class TokenCount:
    """Callable: texts -> the tokens the model sees in each (as given: the caller strips them as the model
    does; special ones included), at most `limit` (None: no cap). `tokenizer`: a `tokenizers.Tokenizer`,
    copied (its truncation and padding are the model's settings, not the count's)."""

    def __init__(self, tokenizer: Any, limit: int | None):
        self.tokenizer = type(tokenizer).from_str(tokenizer.to_str())
        self.tokenizer.no_padding()
        if limit is None:
            self.tokenizer.no_truncation()
        else:
            self.tokenizer.enable_truncation(limit)
        self.limit = limit
        self.specials = len(self.tokenizer.encode("", add_special_tokens=True).ids)
        config = json.loads(self.tokenizer.to_str())
        normalizer, pre_tokenizer = config.get("normalizer") or {}, config.get("pre_tokenizer") or {}
        added = [token["content"] for token in config.get("added_tokens", [])]
        self.lowercase = bool(normalizer.get("lowercase"))
        # An added token is matched before the words are cut: a text holding one (in any case) takes the pipeline.
        self.added = [token.lower() if self.lowercase else token for token in added]
        bert = (normalizer.get("type") == "BertNormalizer" and normalizer.get("clean_text")
                and pre_tokenizer.get("type") == "BertPreTokenizer" and config["model"].get("type") == "WordPiece")
        fits = limit is None or limit >= self.specials
        spaced = any(not token or token.split() != [token] for token in added)
        self.pieces = _WordPieces(self.tokenizer.model) if bert and fits and not spaced else None

    def __call__(self, texts: list[str]) -> list[int]:
        return [self._count(text) for text in texts]

    def _count(self, text: str) -> int:
        count = self._by_words(text) if self.pieces is not None else None
        if count is None:
            # One text a call, without offsets: the least CPU of the pipeline's ways (a batch of many costs
            # more, and more again where Rayon's threads share it out, taking cores the actors embed on).
            count = len(self.tokenizer.encode_batch_fast([text], add_special_tokens=True)[0].ids)
        return count

    def _by_words(self, text: str) -> int | None:
        """The count of a plain text from its words' remembered counts; None: not plain, the pipeline counts it."""
        if not text.isascii() or _CONTROL.search(text):
            return None
        if self.lowercase:
            text = text.lower()
        if any(token in text for token in self.added):
            return None
        count = self.specials + sum(map(self.pieces.__getitem__, _WORD.findall(text)))
        return count if self.limit is None else min(count, self.limit)
