"""pytest plugin: local Ray heads (`ray start --head`, 2 CPUs, on 127.0.0.1 only).

- `ray_address` (module): Ray in this test process (`ray.init`, 2 CPUs, no dashboard), for
  tests that call the driver's `run_job` directly; yields its GCS address. One Ray serves the
  modules of a test process one after the other (each start avoided saves about 5 s here); a
  module that starts a Ray of its own environment (`ray_in_this_process`) stops it first, and
  the next module that asks starts it again.
- `local_ray` (session): a head without dashboard or token authentication; yields its
  address for RAY_ADDRESS. The stand-in for KubeRay runs RayJob entrypoints on it.
- `token_ray` (module): a head with its dashboard and RAY_AUTH_MODE=token and a fresh
  token, for the shared-pool tests; yields a `TokenRay`. Every Ray process gets the token
  through RAY_AUTH_TOKEN and a temp HOME, so the user's ~/.ray/auth_token is neither read
  nor written.

RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray from swapping a loopback address for the
machine's network address (GCS, dashboard and the addresses Ray hands out).
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from controller.ray_jobs_client import RayJobsClient
from embedjob.contract import encode_job_config
from support.net import free_port
from support.paths import REPO
from support.processes import spawn, stop, wait_for
from support.ray_env import RAY_CLIENT_ENV


def ray_head_command(port: int, temp_dir: str, *options: str) -> list[str]:
    """`ray start --head` (2 CPUs) on 127.0.0.1 with free ports for all of its servers.

    Ray's agents and client server default to fixed ports; a second head on this machine
    (another fixture's) would otherwise collide with the first and hang its Jobs API."""
    ports = {flag: free_port() for flag in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                            "metrics-export-port", "runtime-env-agent-port",
                                            "ray-client-server-port")}
    return [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}",
            "--num-cpus=2", "--node-ip-address=127.0.0.1", *(f"--{flag}={p}" for flag, p in ports.items()),
            f"--temp-dir={temp_dir}", "--disable-usage-stats", *options]


@contextmanager
def _ray_head(log: Path, env: dict[str, str], *options: str) -> Iterator[tuple[subprocess.Popen, int]]:
    """A running `ray start --head` (the process, its GCS port); stopped on exit."""
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="ejray-", dir="/tmp")  # Ray's socket paths must stay short
    head = spawn(ray_head_command(port, temp_dir, *options), log, env=env)
    try:
        yield head, port
    finally:
        stop(head, timeout=5)  # Ray drains for 30 s after SIGTERM; nothing here needs draining
        shutil.rmtree(temp_dir, ignore_errors=True)


_session_exit_status = 0


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _session_exit_status
    _session_exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Ends the test process once pytest has reported, without the interpreter's finalization.

    With Ray (and torch, through the model) loaded in this process, the interpreter's teardown of
    their native threads and static objects now and then segfaults after every test passed and the
    summary was printed (seen in CI: 116 passed, then `Segmentation fault`, so the tier failed).
    The atexit handlers still run; then the process exits with pytest's own status."""
    if not {"ray", "torch"} & sys.modules.keys():
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_session_exit_status)


class _SharedRay:
    """The in-process Ray that the `ray_address` modules of this test process share, while it runs."""

    address: str | None = None

    @classmethod
    def start(cls) -> str:
        if cls.address is None:
            cls.address = _init_ray()
        return cls.address

    @classmethod
    def stop(cls) -> None:
        if cls.address is not None:
            import ray

            ray.shutdown()
            cls.address = None


def _init_ray() -> str:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    return ray.get_runtime_context().gcs_address


@contextmanager
def ray_in_this_process(env: dict[str, str] | None = None) -> Iterator[str]:
    """Ray in this test process (2 CPUs, no dashboard) started with `env` added to os.environ, which its
    worker processes (the actors) inherit, as a Ray pod's do its environment; yields its GCS address.
    The shared Ray of `ray_address` is stopped first: one Ray at a time runs in a process."""
    import ray

    _SharedRay.stop()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        address = _init_ray()
        try:
            yield address
        finally:
            ray.shutdown()


@pytest.fixture(scope="session")
def _shared_ray():
    yield _SharedRay
    _SharedRay.stop()


@pytest.fixture(scope="module")
def ray_address(_shared_ray):
    """The shared in-process Ray's GCS address (started if it is not running)."""
    return _shared_ray.start()


@pytest.fixture(scope="session")
def local_ray(tmp_path_factory):
    """A local Ray head (2 CPUs, no dashboard); yields its address for RAY_ADDRESS."""
    log = tmp_path_factory.mktemp("ray") / "ray-head.log"
    with _ray_head(log, {**os.environ, **RAY_CLIENT_ENV}, "--include-dashboard=false") as (head, port):
        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_for("the Ray head", listening, 120, head, log, interval=0.5)
        yield f"127.0.0.1:{port}"


@dataclass(frozen=True)
class TokenRay:
    gcs_address: str
    dashboard_url: str
    token: str
    env: dict[str, str]  # for every process that talks to this cluster (drivers, the head)

    def client(self) -> RayJobsClient:
        return RayJobsClient(self.dashboard_url, self.token)

    def actors(self, name_prefix: str) -> list[dict]:
        """Actors (any state, all namespaces) whose name starts with `name_prefix`, from the
        dashboard's state API."""
        reply = self.client()._call("GET", "/api/v0/actors?limit=10000&detail=true")
        return [a for a in reply["data"]["result"]["result"] if (a.get("name") or "").startswith(name_prefix)]

    def driver(self, manifest: dict, database_url: str, log_path: Path) -> subprocess.Popen:
        """`python -m embedjob_worker.driver` for the manifest, as the RayJob would run it."""
        env = {**self.env, "EMBEDJOB_DATABASE_URL": database_url}
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "embedjob_worker.driver", "--config-b64", encode_job_config(manifest),
                 "--ray-address", self.gcs_address],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="module")  # one module per tier uses it; idle, its dashboard costs ~6% of a core
def token_ray(tmp_path_factory):
    token = secrets.token_hex(24)
    dashboard_port = free_port()
    log = tmp_path_factory.mktemp("token-ray") / "ray-head.log"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "EMBEDJOB_"))},
        "HOME": str(tmp_path_factory.mktemp("ray-home")),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
    }
    with _ray_head(log, env, "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}") as (head, port):
        cluster = TokenRay(f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard_port}", token, env)

        def accepts_jobs() -> bool:  # the Jobs API answers 500 until the head's dashboard agent is up
            cluster.client().run("true", f"ready-{secrets.token_hex(4)}", timeout_s=60)
            return True

        wait_for("the Ray head's Jobs API", accepts_jobs, 180, head, log, interval=1)
        yield cluster
