"""Crashing a driver mid-job: the RayJob entrypoint as a subprocess, SIGKILLed once some batches are written."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from embedjob.contract import encode_job_config
from support.polling import wait_until
from support.sql import query


def succeeded_batches(url: str) -> int:
    try:
        return query(url, "SELECT count(*) FROM embedjob_batches WHERE state = 'succeeded'")[0][0]
    except sa.exc.ProgrammingError:  # the driver has not migrated the database yet
        return 0


def kill_driver_after(spec: dict, database_url: str, ray_address: str, log_path: Path, batches: int,
                      timeout: float = 180) -> tuple[set[str], set[str]]:
    """Run `python -m embedjob_worker.driver` on `ray_address`, SIGKILL it once `batches` batches
    succeeded; the ids of the batches committed and of those it had dispatched (from its log)."""
    env = {**os.environ, "EMBEDJOB_DATABASE_URL": database_url, "HF_HUB_OFFLINE": "1"}
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "embedjob_worker.driver", "--config-b64", encode_job_config(spec),
             "--ray-address", ray_address], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(f"{batches} batches to succeed or the driver to end",
                       lambda: succeeded_batches(database_url) >= batches or process.poll() is not None,
                       timeout=timeout)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
    assert process.returncode == -signal.SIGKILL, log_path.read_text()[-2000:]
    committed = {r[0] for r in query(database_url, "SELECT batch_id FROM embedjob_batches WHERE state = 'succeeded'")}
    dispatched = set(re.findall(r"event=batch_dispatched batch=(\w+)", log_path.read_text()))
    return committed, dispatched
