"""Cutting long texts into overlapping chunks by the model's own tokenizer, with character offsets into the text.

A text of at most `max_tokens` tokens (special tokens included, as the model counts) is
one chunk, 0, over the whole text. A longer one is cut into windows of `max_tokens` less
the special tokens, each starting up to `overlap` tokens before the end of the one before
it. Cuts fall on word starts (the tokenizer's pre-tokenizer words), so a chunk's text
tokenizes to the tokens that were counted; only a single word longer than a window is cut
inside it. No cut splits a character that a reader sees as one (a letter and its
combining marks, an emoji sequence joined by ZWJ, a flag's two regional indicators).

Offsets are Python string indices (code points, as PostgreSQL's substr counts them). They
cover the text: the first chunk starts at 0, the last ends at its end, and each chunk
starts at or before the end of the one before it (a chunk's end reaches to the next
token, so the white space between two chunks belongs to the first). Each chunk's text is
tokenized once more and shrunk, a word at a time, should the model see more than
`max_tokens` tokens in it: planned chunks are never truncated.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

from embedjob_worker.core.records import Span
from embedjob_worker.plan.counting import TokenCount

_ZWJ = "\u200d"


def _regional_indicator(char: str) -> bool:
    return 0x1F1E6 <= ord(char) <= 0x1F1FF


def _extends(char: str) -> bool:
    """A character that belongs to the one before it: combining marks, variation selectors, emoji
    skin-tone modifiers and tag characters (subdivision flags)."""
    code = ord(char)
    return (unicodedata.category(char) in ("Mn", "Mc", "Me") or 0xFE00 <= code <= 0xFE0F
            or 0x1F3FB <= code <= 0x1F3FF or 0xE0020 <= code <= 0xE007F or 0xE0100 <= code <= 0xE01EF)


def _splits_a_character(text: str, pos: int) -> bool:
    before, after = text[pos - 1], text[pos]
    if _extends(after) or before == _ZWJ or after == _ZWJ or (before, after) == ("\r", "\n"):
        return True
    if _regional_indicator(before) and _regional_indicator(after):
        run = pos - 1
        while run > 0 and _regional_indicator(text[run - 1]):
            run -= 1
        return (pos - run) % 2 == 1  # inside a pair
    return False


def safe_cut(text: str, pos: int) -> int:
    """`pos`, moved forward until a cut there splits no user-perceived character."""
    while 0 < pos < len(text) and _splits_a_character(text, pos):
        pos += 1
    return pos


def chunk_spans(text: str, offsets: Sequence[tuple[int, int]], words: Sequence[int | None], max_tokens: int,
                specials: int, overlap: int, count: Callable[[str], int] | None) -> tuple[Span, ...]:
    """The chunks of `text` whose tokens (without special tokens) are at `offsets`, of pre-tokenizer
    words `words`; `specials` special tokens are added to each chunk, `count(chunk text)` says how
    many tokens the model sees in one (None: trust the tokens planned, to be checked by the caller).
    Deterministic: the same text gives the same chunks."""
    n = len(offsets)
    if n + specials <= max_tokens:
        return (Span(0, len(text), n + specials),)
    window = max_tokens - specials
    if window - overlap < 1:
        raise ValueError(f"a chunk of {max_tokens} tokens holds {window} besides the special ones: too few for an "
                         f"overlap of {overlap}")
    word_start = [i == 0 or words[i] is None or words[i] != words[i - 1] for i in range(n)]

    def cut_before(low: int, end: int) -> int:
        """The last word start in (low, end), else end - 1 (inside one long word)."""
        b = end - 1
        while b > low and not word_start[b]:
            b -= 1
        return b if b > low else end - 1

    def char_span(i: int, e: int) -> tuple[int, int]:
        start = 0 if i == 0 else safe_cut(text, offsets[i][0])
        return start, (len(text) if e >= n else max(start + 1, safe_cut(text, offsets[e][0])))

    spans: list[Span] = []
    i = previous_end = 0
    while True:
        low = max(i, previous_end)  # a chunk ends past the one before it, or it would add nothing
        e = min(i + window, n)
        if e < n and not word_start[e] and any(word_start[low + 1 : e + 1]):
            e = cut_before(low, e + 1)
        start, end = char_span(i, e)
        tokens = count(text[start:end]) if count else e - i + specials
        while tokens > max_tokens and e - 1 > low:  # the words tokenize differently on their own: one word less
            e = cut_before(low, e)
            start, end = char_span(i, e)
            tokens = count(text[start:end])
        spans.append(Span(start, end, tokens))
        previous_end = e
        if e >= n:
            return tuple(spans)
        j = max(e - overlap, i + 1)  # the next chunk starts on the first word start at most `overlap` back
        while j < e and not word_start[j]:
            j += 1
        i = j


class Chunker:
    """Callable: texts -> their chunks (chunk_spans), by a `tokenizers.Tokenizer` (the model's own)."""

    def __init__(self, tokenizer: Any, max_tokens: int, overlap: int, prompt_tokens: int = 0):
        self.counter = TokenCount(tokenizer, None)
        self.tokenizer = self.counter.tokenizer  # a copy that neither truncates nor pads
        self.max_tokens, self.overlap = max_tokens, overlap
        self.prompt_tokens = prompt_tokens  # what the document prompt adds to each chunk the model sees
        self.specials = self.counter.specials
        if max_tokens - self.specials - overlap < 1:
            raise ValueError(f"maxTokens {max_tokens} leaves {max_tokens - self.specials} tokens besides the model's "
                             f"{self.specials} special ones: not more than overlapTokens {overlap}")

    def count(self, text: str) -> int:
        """The tokens the model sees in `text`: stripped as sentence-transformers strips it, special ones included."""
        return self.counter([text.strip()])[0]

    def __call__(self, texts: list[str]) -> list[tuple[Span, ...]]:
        """Each text's chunks: a text within maxTokens is one chunk (counted only); a longer one is planned from
        its tokens' offsets, then its chunks counted; one with a chunk over maxTokens is planned again, counting
        each."""
        chunks = [(Span(0, len(text), tokens),) for text, tokens in zip(texts, self.counter(texts))]
        long = [k for k, (span,) in enumerate(chunks) if span.tokens > self.max_tokens]
        encodings = dict(zip(long, self.tokenizer.encode_batch([texts[k] for k in long], add_special_tokens=False)))
        for k, enc in encodings.items():
            chunks[k] = chunk_spans(texts[k], enc.offsets, enc.word_ids, self.max_tokens, self.specials,
                                    self.overlap, None)
        cut = [(k, span) for k in long for span in chunks[k]]
        counted = self.counter([texts[k][s.start : s.end].strip() for k, s in cut])
        recounted: dict[int, list[Span]] = {}
        for (k, span), tokens in zip(cut, counted):
            recounted.setdefault(k, []).append(Span(span.start, span.end, tokens))
        for k, spans in recounted.items():
            if max(s.tokens for s in spans) <= self.max_tokens:
                chunks[k] = tuple(spans)
            else:
                enc = encodings[k]
                chunks[k] = chunk_spans(texts[k], enc.offsets, enc.word_ids, self.max_tokens, self.specials,
                                        self.overlap, self.count)
        return chunks
