"""The operator <-> driver contract: entrypoints, the job config's encoding, env names, exit codes.

Both sides import this module (it imports nothing heavy), so a fact they must agree on
is spelled once:

- the RayJob entrypoint `python -m embedjob_worker.driver --config-b64 <config>`, where
  the config is base64 of compact JSON (safe from shell quoting) holding only the
  manifest's apiVersion, kind, metadata (name, namespace, uid) and spec; credentials
  never travel in it;
- the database URL reaches the driver in the environment (`DATABASE_URL_ENV`, from the
  user's Secret through `secretKeyRef`), and so does its metrics port;
- the driver's exit codes, and the status reasons the operator turns them into;
- the pool-removal entrypoint the operator runs on a shared Ray cluster.
"""

from __future__ import annotations

import base64
import binascii
import json
import shlex
from enum import IntEnum
from typing import Any

from embedjob.api import API_VERSION, KIND, SpecError

DRIVER_MODULE = "embedjob_worker.driver"
POOLS_MODULE = "embedjob_worker.pools"
CONFIG_FLAG = "--config-b64"

DATABASE_URL_ENV = "EMBEDJOB_DATABASE_URL"
# A table source's own database (spec.source.databaseSecretRef); unset: the sink's.
SOURCE_DATABASE_URL_ENV = "EMBEDJOB_SOURCE_DATABASE_URL"
# Test hook: JSON handed to every EmbeddingWorker actor (see embedjob_worker.encode.actors).
FAULT_INJECTION_ENV = "EMBEDJOB_FAULT_INJECTION"
# The port the driver serves Prometheus metrics on (empty or 0: none); the head pod names it
# DRIVER_METRICS_PORT_NAME, which the chart's PodMonitor scrapes.
DRIVER_METRICS_PORT_ENV = "EMBEDJOB_DRIVER_METRICS_PORT"
DRIVER_METRICS_PORT = 8090
DRIVER_METRICS_PORT_NAME = "driver-metrics"
# Every variable the driver reads: the operator sets each in the Ray containers' `env` (empty when unused),
# which wins over `envFrom`, so a Secret or ConfigMap given without a prefix cannot set one.
DRIVER_ENV = (DATABASE_URL_ENV, SOURCE_DATABASE_URL_ENV, FAULT_INJECTION_ENV, DRIVER_METRICS_PORT_ENV)
# The value the operator gives a variable that no Secret sets.
DRIVER_ENV_VALUES = {DRIVER_METRICS_PORT_ENV: str(DRIVER_METRICS_PORT)}


class ExitCode(IntEnum):
    """The driver's exit status; KubeRay reports it in the RayJob's message."""

    SUCCEEDED = 0
    JOB_FAILED = 1  # the run row says why
    INVALID_CONFIG = 2
    RAY_UNREACHABLE = 3
    DATABASE_UNREACHABLE = 4


# A live driver refreshes heartbeat_at (its run row, its pool lease) at least this often; the operator
# takes a run or lease whose heartbeat is many of these old as a dead driver's.
HEARTBEAT_S = 5.0

# A pool lease whose heartbeat is older than this is not live: the operator's default
# (EMBEDJOB_POOL_LEASE_EXPIRY_SECONDS), and how long a driver goes on without getting a
# heartbeat through before it counts its lease lost (embedjob_worker.encode.lease).
POOL_LEASE_EXPIRY_SECONDS = 60.0

# The status reason for an exit code that leaves no run row to read the reason from.
EXIT_REASONS = {
    ExitCode.INVALID_CONFIG: "InvalidSpec",
    ExitCode.RAY_UNREACHABLE: "RayUnavailable",
    ExitCode.DATABASE_UNREACHABLE: "DatabaseUnavailable",
}

_METADATA_FIELDS = ("name", "namespace", "uid")


def job_config(manifest: dict[str, Any]) -> dict[str, Any]:
    """The part of an EmbeddingJob manifest the driver needs (no status, no annotations, no pod settings:
    those are the operator's, and would only make the entrypoint's one argument larger)."""
    metadata = manifest.get("metadata") or {}
    spec = {k: v for k, v in (manifest.get("spec") or {}).items() if k != "head"}
    if isinstance(spec.get("workers"), dict):
        spec["workers"] = {k: v for k, v in spec["workers"].items() if k != "template"}
    return {
        "apiVersion": manifest.get("apiVersion", API_VERSION),
        "kind": manifest.get("kind", KIND),
        "metadata": {k: metadata[k] for k in _METADATA_FIELDS if metadata.get(k)},
        "spec": spec,
    }


def encode_job_config(manifest: dict[str, Any]) -> str:
    """Base64 (standard alphabet) of the compact, key-sorted JSON of `job_config(manifest)`."""
    payload = json.dumps(job_config(manifest), separators=(",", ":"), sort_keys=True)
    return base64.b64encode(payload.encode()).decode("ascii")


# Where a failed job's condition message sends its reader (`embedjob logs`, the operator's
# Failed message); the same words as docs/troubleshooting.md.
LOGS_HINT = "the driver's log: `embedjob logs {name} -n {namespace}` (docs/troubleshooting.md)"


def decode_job_config(encoded: str) -> dict[str, Any]:
    """Inverse of `encode_job_config`; raises SpecError for anything that is not a job config."""
    try:
        manifest = json.loads(base64.b64decode(encoded.encode("ascii"), validate=True))
    except (binascii.Error, UnicodeError, ValueError) as exc:
        raise SpecError([(CONFIG_FLAG, f"not base64 of a JSON object: {exc}")]) from None
    if not isinstance(manifest, dict):
        raise SpecError([(CONFIG_FLAG, "expected a JSON object")])
    return manifest


def driver_command(manifest: dict[str, Any]) -> str:
    """The RayJob entrypoint that runs the driver on this job."""
    return shlex.join(["python", "-m", DRIVER_MODULE, CONFIG_FLAG, encode_job_config(manifest)])


def pool_removal_command(pool: str) -> str:
    """The Ray job entrypoint that removes a detached actor pool from a shared cluster."""
    return shlex.join(["python", "-m", POOLS_MODULE, "remove", "--pool", pool])
