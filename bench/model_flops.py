"""How near a CPU run is to the CPU's float32 peak: an encoder's FLOPs per text, against cores × clock × FMA width.

FLOPs of one forward pass of a BERT-layout encoder (hidden size d, feed-forward size f, L layers) over a text
of n tokens, a multiply-add counted as 2: per layer, the Q, K, V and output projections 2·4·n·d², the
feed-forward 2·2·n·d·f, the attention scores and their weighted sum 2·2·n²·d. Embeddings, layer norms, softmax
and pooling are under 1% and not counted. The tokens are each text's own, truncated at the model's
max_seq_length and without padding: the work a text needs, so padding counts as waste in the fraction.

The peak is the issue's yardstick: cores × clock × 32 float32 FLOPs a cycle (AVX2: two 256-bit FMA units, 8
lanes, a multiply-add each). A CPU with AVX-512 and two 512-bit FMA units can do twice that; the report says
which instructions the CPU has. The clock is /proc/cpuinfo's `cpu MHz` (a VM often shows the nominal one).
"""

from __future__ import annotations

import json
from pathlib import Path

AVX2_FMA_FLOPS_PER_CYCLE = 32


def encoder_flops(tokens: int, hidden: int, ffn: int, layers: int) -> int:
    """FLOPs of one forward pass over `tokens` tokens (module docstring)."""
    per_layer = 8 * tokens * hidden * hidden + 4 * tokens * hidden * ffn + 4 * tokens * tokens * hidden
    return layers * per_layer


def mean_text_flops(texts: list[str], model_dir: str) -> tuple[float, float]:
    """Mean FLOPs and mean tokens per text for the sentence-transformers model at `model_dir` (its transformer's
    config.json and its sentence_bert_config.json's max_seq_length)."""
    from transformers import AutoTokenizer

    root = Path(model_dir)
    config = json.loads((root / "config.json").read_text())
    max_tokens = json.loads((root / "sentence_bert_config.json").read_text())["max_seq_length"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lengths = [min(len(ids), max_tokens) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]
    flops = [encoder_flops(n, config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"])
             for n in lengths]
    return sum(flops) / len(flops), sum(lengths) / len(lengths)


def cpu_peak(cpus: int, cpuinfo: str | None = None) -> tuple[float, str]:
    """The float32 FLOPs/s of `cpus` cores at the AVX2 FMA width, and what was assumed (model, clock, ISA)."""
    text = cpuinfo if cpuinfo is not None else Path("/proc/cpuinfo").read_text()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first core's
    mhz, flags = float(fields["cpu MHz"]), set(fields.get("flags", "").split())
    isa = "AVX-512" if "avx512f" in flags else "AVX2 with FMA" if {"avx2", "fma"} <= flags else "no AVX2 FMA"
    peak = cpus * mhz * 1e6 * AVX2_FMA_FLOPS_PER_CYCLE
    return peak, (f"{fields.get('model name', 'unknown CPU')}, {cpus} cores × {mhz / 1000:.2f} GHz × "
                  f"{AVX2_FMA_FLOPS_PER_CYCLE} FLOPs/cycle = {peak / 1e9:.0f} GFLOP/s (the CPU has {isa})")
