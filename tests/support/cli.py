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


def on_ray(address: str) -> list[str]:
    """`embedjob run`'s arguments to run on a Ray head the tests started (plugins.ray_heads.local_ray) instead of
    starting one: for tests whose subject is not that start (a Ray start costs ~9 s of CPU here)."""
    return ["--ray-address", address]


def run(args: list[str], env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`args` run with this environment and `env` (a variable given None is unset); with --ray-address, as a client
    of the tests' Ray heads (RAY_CLIENT_ENV)."""
    merged = {**os.environ, "HF_HUB_OFFLINE": "1", **(RAY_CLIENT_ENV if "--ray-address" in args else {}),
              **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                          env={name: value for name, value in merged.items() if value is not None})
