"""bench/gpu.py on a machine without a GPU: its CPU smoke mode runs every contender, and without --dry-run it
stops with a message saying that no GPU is visible."""

import os
import subprocess
import sys

import pytest

from support.paths import REPO

pytestmark = pytest.mark.slow
BENCH = REPO / "bench" / "gpu.py"


def bench(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], cwd=REPO / "bench", capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_the_dry_run_exercises_encode_shared_actors_and_the_driver_on_cpu():
    result = bench("--dry-run", "--texts", "80", "--budgets", "2048", "--actors", "2", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DRY RUN (CPU smoke mode)" in result.stdout
    for row in ("| encode, batch 1024, float32 texts/s |", "| 2 actor(s)/GPU, maxTokens 2048, float32, no DB tokens/s |",
                "| driver + PostgreSQL, 2 actor(s)/GPU, maxTokens 2048, float32 texts/s |"):
        assert row in result.stdout, result.stdout


def test_without_a_gpu_it_says_so_instead_of_a_traceback():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = bench("--texts", "10", timeout=300)
    assert result.returncode == 1
    assert "bench/gpu.py: no CUDA GPU is visible" in result.stderr and "--dry-run" in result.stderr
    assert "Traceback" not in result.stderr
