"""The RayJob entrypoint (embedjob.contract.DRIVER_MODULE): arguments, connecting to Ray, exit codes.

    python -m embedjob_worker.driver --config-b64 <base64 JSON> [--ray-address ADDR] [--ray-connect-timeout S]
                                     [--metrics-port N] [--new-run]

connects only to the given Ray cluster (never starts one), reads the database URL from
EMBEDJOB_DATABASE_URL (a table source's own database from EMBEDJOB_SOURCE_DATABASE_URL) and runs the job (embedjob_worker.run.job). Exit codes: 0 succeeded,
1 job failed (the run row says why), 2 invalid config, 3 Ray unreachable, 4 the
database unreachable. See docs/driver.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
import time

import ray

from embedjob.api import SpecError
from embedjob.contract import (
    CONFIG_FLAG, DATABASE_URL_ENV, DRIVER_METRICS_PORT_ENV, FAULT_INJECTION_ENV, SOURCE_DATABASE_URL_ENV, ExitCode,
    decode_job_config,
)

from embedjob_worker.core.config import JobConfig
from embedjob_worker.core.errors import RayUnreachable, Unreachable, unreachable_exit_code
from embedjob_worker.core.logs import configure_logging, log_event, mask_secrets, mask_url
from embedjob_worker.core.metrics import DriverMetrics, metrics_port_from_env
from embedjob_worker.run.job import DriverOptions, run_job

log = logging.getLogger("embedjob_worker.driver")
# How long connecting to the Ray cluster may take before the driver gives up (exit 3).
RAY_CONNECT_TIMEOUT_S = 60.0


def fault_injection_from_env() -> dict | None:
    value = os.environ.get(FAULT_INJECTION_ENV)
    return json.loads(value) if value else None


def connect_ray(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S, log_to_driver: bool = True) -> None:
    """Connect to an existing Ray cluster only, within `timeout_s`; never start a local one.

    The TCP check finds an address nobody listens on. A GCS that accepts and never answers,
    or one that names a head node this pod cannot reach, keeps ray.init retrying for
    minutes, and it cannot be interrupted from here: a watchdog ends the process with
    exit 3 (RayUnavailable) once the deadline passes. Nothing has been started by then.
    """
    started = time.monotonic()
    if address != "auto":
        host_port = address.split("://", 1)[-1].rstrip("/")
        host, _, port = host_port.rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=min(timeout_s, 10.0)).close()
        except (OSError, ValueError) as exc:
            raise RayUnreachable(f"cannot reach the Ray cluster at {address}: {exc}") from None
    watchdog = threading.Timer(max(0.0, timeout_s - (time.monotonic() - started)), _connect_timed_out,
                               (address, timeout_s))
    watchdog.daemon = True
    watchdog.start()
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=log_to_driver)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        # A cluster with token authentication refuses a missing or wrong RAY_AUTH_TOKEN the same way.
        raise RayUnreachable(f"cannot connect to the Ray cluster at {address} (token authentication: is "
                             f"RAY_AUTH_TOKEN the cluster's?): {exc}") from None
    finally:
        watchdog.cancel()


def _connect_timed_out(address: str, timeout_s: float) -> None:
    message = (f"cannot connect to the Ray cluster at {address}: no connection after {timeout_s:.0f}s "
               "(the address answers TCP but no Ray GCS answered, or the head node it names is unreachable "
               "from here)")
    log_event(log, "unreachable", logging.ERROR, error=message)
    print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(ExitCode.RAY_UNREACHABLE)  # ray.init still holds the main thread


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m embedjob_worker.driver", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    config = parser.add_mutually_exclusive_group(required=True)
    config.add_argument(CONFIG_FLAG, help="base64 of the job config JSON (embedjob.contract.encode_job_config)")
    config.add_argument("--config", help="the EmbeddingJob manifest as a YAML or JSON file")
    parser.add_argument("--ray-address", help="Ray cluster to connect to (default: $RAY_ADDRESS)")
    parser.add_argument("--ray-connect-timeout", type=float, default=RAY_CONNECT_TIMEOUT_S, metavar="SECONDS",
                        help=f"give up connecting to Ray after this long, exit 3 (default {RAY_CONNECT_TIMEOUT_S:.0f})")
    parser.add_argument("--metrics-port", type=int,
                        help=f"serve Prometheus metrics on this port (default: ${DRIVER_METRICS_PORT_ENV}; 0: none)")
    parser.add_argument("--new-run", action="store_true", help="start a new run even if the input changed")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    database_url = os.environ.get(DATABASE_URL_ENV, "")
    source_database_url = os.environ.get(SOURCE_DATABASE_URL_ENV) or None
    configure_logging(secrets=[database_url, source_database_url or ""])
    try:
        config = (JobConfig.from_file(args.config) if args.config
                  else JobConfig.from_manifest(decode_job_config(args.config_b64)))
    except (SpecError, OSError) as exc:
        log_event(log, "invalid_config", logging.ERROR, error=str(exc))
        print(f"invalid job config: {mask_secrets(str(exc))}", file=sys.stderr)
        return ExitCode.INVALID_CONFIG
    if not database_url:
        print(f"invalid job config: {DATABASE_URL_ENV} is not set", file=sys.stderr)
        return ExitCode.INVALID_CONFIG
    if config.spec.source.database_secret_ref is not None and not source_database_url:
        # Never the sink's database in its place: a same-named table there is not the job's input.
        print(f"invalid job config: spec.source.databaseSecretRef is set and {SOURCE_DATABASE_URL_ENV} is not",
              file=sys.stderr)
        return ExitCode.INVALID_CONFIG
    address = args.ray_address or os.environ.get("RAY_ADDRESS")
    if not address:
        print("no Ray cluster given: pass --ray-address or set RAY_ADDRESS (the driver never starts Ray itself)",
              file=sys.stderr)
        return ExitCode.RAY_UNREACHABLE
    log_event(log, "driver_starting", job=config.job_key, ray_address=address, database=mask_url(database_url))
    try:
        connect_ray(address, args.ray_connect_timeout)
        metrics = DriverMetrics()
        metrics.serve(args.metrics_port if args.metrics_port is not None
                      else metrics_port_from_env(os.environ.get(DRIVER_METRICS_PORT_ENV)))
        options = DriverOptions(new_run=args.new_run, metrics=metrics, fault_injection=fault_injection_from_env(),
                                source_database_url=source_database_url)
        summary = run_job(config, database_url, options)
    except Unreachable as exc:
        log_event(log, "unreachable", logging.ERROR, error=str(exc))
        print(mask_secrets(str(exc)), file=sys.stderr)
        return unreachable_exit_code(exc)
    return ExitCode.SUCCEEDED if summary.state == "succeeded" else ExitCode.JOB_FAILED


if __name__ == "__main__":
    sys.exit(main())
