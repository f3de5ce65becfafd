"""bench/model_flops.py: an encoder's FLOPs per text and the CPU's float32 peak, checked by hand-worked values."""

from __future__ import annotations

import sys

import pytest

from support.paths import REPO

sys.path.insert(0, str(REPO / "bench"))
from model_flops import cpu_peak, encoder_flops  # noqa: E402

CPUINFO = """processor	: 0
model name	: Intel(R) Xeon(R) Processor
cpu MHz		: 2600.000
flags		: fpu sse2 avx fma avx2 avx512f
processor	: 1
model name	: Intel(R) Xeon(R) Processor
cpu MHz		: 1200.000
flags		: fpu sse2 avx fma avx2 avx512f
"""


def test_encoder_flops_count_projections_feed_forward_and_attention():
    # all-MiniLM-L6-v2 (d 384, f 1536, 6 layers) on 128 tokens, worked by hand:
    # per layer 8·128·384² = 150,994,944; 4·128·384·1536 = 301,989,888; 4·128²·384 = 25,165,824
    assert encoder_flops(128, 384, 1536, 6) == 6 * (150_994_944 + 301_989_888 + 25_165_824)
    assert encoder_flops(0, 384, 1536, 6) == 0
    # the attention term grows with the square of the tokens, the rest linearly
    assert encoder_flops(256, 384, 1536, 6) - 2 * encoder_flops(128, 384, 1536, 6) == 6 * 4 * 128 * 128 * 384 * 2


def test_the_peak_is_cores_times_the_first_cores_clock_times_the_avx2_fma_width():
    peak, said = cpu_peak(2, CPUINFO)
    assert peak == pytest.approx(2 * 2.6e9 * 32)
    assert said == ("Intel(R) Xeon(R) Processor, 2 cores × 2.60 GHz × 32 FLOPs/cycle = 166 GFLOP/s "
                    "(the CPU has AVX-512)")
    assert "no AVX2 FMA" in cpu_peak(1, "cpu MHz : 1000\nflags : sse2 avx\n")[1]
