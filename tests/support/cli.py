"""The `embedjob` CLI and the driver's entrypoint as subprocesses, and a manifest for them."""

from __future__ import annotations

import os
import subprocess
import sys

from support.ray_env import RAY_CLIENT_ENV
from support.job_models import FAST_START_MODEL

EMBEDJOB = [sys.executable, "-c", "import sys; from embedjob_cli.main import main; sys.exit(main())"]
DRIVER = [sys.executable, "-m", "embedjob_worker.driver"]


def manifest(uri: str, model: dict = FAST_START_MODEL, **batching) -> dict:
    return {
        "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob", "metadata": {"name": "cli"},
        "spec": {
            "source": {"uri": uri},
            "model": dict(model),
            "batching": {"batchSize": 32, **batching},
            "workers": {"cpusPerActor": 2},
            "sink": {"databaseSecretRef": {"name": "db"}, "collection": "cli"},
        },
    }


def run(args: list[str], env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`args` run with this environment and `env` (a variable given None is unset)."""
    merged = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                          env={name: value for name, value in merged.items() if value is not None})


def run_on_ray(address: str, args: list[str], env: dict | None = None, timeout: float = 300
               ) -> subprocess.CompletedProcess:
    """`embedjob run ...` (`args`) on a Ray head the tests started (plugins.ray_heads.local_ray) with --ray-address,
    as that head's client (RAY_CLIENT_ENV), instead of starting a Ray of its own: for tests whose subject is not
    that start (a Ray start costs ~9 s of CPU here)."""
    return run([*args, "--ray-address", address], {**RAY_CLIENT_ENV, **(env or {})}, timeout)
