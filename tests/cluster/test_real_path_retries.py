"""KubeRay's own RayJob retry (`spec.backoffLimit`) recovers a job whose driver died, on the real path.

KubeRay v1.6 (ray-operator `controllers/ray/rayjob_controller.go`): in K8sJobMode a RayJob is
`Failed` once the Ray job is FAILED and the submitter Job has finished (the submitter's
`ray job logs --follow` then exits 0); `checkBackoffLimitAndUpdateStatusIfNeeded` counts the
failure in `status.failed` and, while `failed < backoffLimit + 1`, sets `Retrying` instead;
`Retrying` deletes the RayCluster and the submitter Job, resets `rayClusterName` and `jobId`,
and `New` creates a new RayCluster (a new generated name) and a new submission. So each
retry is a new cluster, new pods and a new driver, which resumes the run.

The first attempt's driver is killed with SIGKILL (containers are processes on this machine:
it is found by its command line, the job config naming this namespace and job). That is the
"driver killed" fault: nothing it had not committed is kept, nothing committed is redone.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from embedjob.contract import CONFIG_FLAG, DRIVER_MODULE, decode_job_config
from support.kubectl import events_for, get_json, rayjobs
from support.polling import wait_until
from support.real_path import (PodWatcher, diagnostics, final_state, long_input, progress, start_long_job,
                               succeeded_batch_counts)
from support.real_path import pod_visible_dir, real_path  # noqa: F401 - fixtures
from support.sql import vectors

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def driver_pids(namespace: str, name: str) -> list[int]:
    """Processes on this machine running our driver for the job `namespace/name`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if DRIVER_MODULE not in argv or CONFIG_FLAG not in argv[:-1]:
            continue
        meta = decode_job_config(argv[argv.index(CONFIG_FLAG) + 1]).get("metadata", {})
        if (meta.get("namespace"), meta.get("name")) == (namespace, name):
            pids.append(int(proc.name))
    return pids


def test_rayjob_backoff_limit_retries_on_a_new_cluster_after_the_driver_is_killed(
        real_path, real_node, kuberay_operator, pod_database_url, pod_visible_dir):
    kube, namespace, operator = real_path
    uri, ids = long_input(pod_visible_dir)  # SIGKILL stops the driver at once
    with PodWatcher(kube, namespace) as watcher:
        start_long_job(kube, namespace, "retried", uri, retry={"backoffLimit": 1})
        wait_until("ten batches written", lambda: progress(kube, namespace, "retried").get(
            "batchesSucceeded", 0) >= 10, timeout=300)
        first = get_json(kube, "ej", "retried", "-n", namespace)["status"]
        [rayjob] = rayjobs(kube, namespace)
        assert rayjob["spec"]["backoffLimit"] == 1
        pids = driver_pids(namespace, "retried")
        assert pids, "no driver process of this job on the machine"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        written_before = len(vectors(pod_database_url))
        assert 80 <= written_before < len(ids)

        # KubeRay counts the failure and retries: a new RayCluster, while the EmbeddingJob waits
        retrying = wait_until("the RayJob retried (status.failed 1)", lambda: (lambda r: r if (
            r["status"].get("failed") or 0) >= 1 else None)(rayjobs(kube, namespace)[0]), timeout=300)
        job = final_state(kube, namespace, "retried")
        time.sleep(1.5)
        explain = diagnostics(kube, namespace, real_node, kuberay_operator, operator, watcher)
    print(f"\nbackoffLimit retry: {written_before} of {len(ids)} vectors when the driver was killed; "
          f"status {job['status']}\nstates: {watcher.job_states}\npods:\n{watcher.summary()}")
    status = job["status"]
    assert status["state"] == "Complete" and status["reason"] == "Succeeded", (status, explain)
    assert status["rayClusterName"] != first["rayClusterName"], status  # the retry ran on a new cluster
    [rayjob] = rayjobs(kube, namespace)
    assert rayjob["status"]["failed"] == 1 and rayjob["status"]["succeeded"] == 1, rayjob["status"]
    assert retrying["status"]["failed"] == 1
    heads = watcher.of_kind("head")
    assert len(heads) == 2 and len({watcher.labels[h]["ray.io/cluster"] for h in heads}) == 2, watcher.summary()
    assert len(watcher.submitters()) >= 2, watcher.summary()

    # every record once; no batch that was committed before the kill computed again
    assert status["progress"]["recordsEmbedded"] == len(ids)
    rows = vectors(pod_database_url)
    assert len(rows) == len(ids) and sorted(r[0] for r in rows) == sorted(ids)
    succeeded = succeeded_batch_counts(pod_database_url)
    assert succeeded and set(succeeded.values()) == {1}, succeeded
    # The EmbeddingJob went back to Pending/Retrying while KubeRay replaced the cluster (KubeRay's own
    # `Retrying` lasts one reconcile; the mirrored failed count carries it) and ran again; it was
    # never final before the end.
    assert status["failedAttempts"] == 1, status
    seen = [(state, reason) for state, reason in watcher.job_states["retried"] if state]
    states = [state for i, (state, _) in enumerate(seen) if i == 0 or seen[i - 1][0] != state]
    assert states[states.index("Running"):] == ["Running", "Pending", "Running", "Complete"], watcher.job_states
    assert ("Pending", "Retrying") in seen, watcher.job_states
    reasons = [e["reason"] for e in events_for(kube, namespace, "retried")]
    assert reasons.count("JobRunning") == 2 and reasons.count("Succeeded") == 1, reasons
