"""End to end through the real path: no stand-in.

`kubectl apply` of an EmbeddingJob -> the operator (a process, as a ServiceAccount) -> its
RayJob -> the real KubeRay operator (`--use-kubernetes-proxy`) -> a RayCluster with token
auth -> head and worker pods scheduled by the real kube-scheduler and run by the test node
(`ray start` for real) -> KubeRay's submitter Job (`ray job submit`, run by the real Job
controller) -> our driver on the head -> vectors in PostgreSQL (reached by the pods over the
test bridge) -> the EmbeddingJob `Complete`.

What an image would bring is on the node (tests/envtest/node/README.md): the project's
virtualenv (Ray, the driver, the packaged model) and the worker image's ENV
(`HF_HUB_OFFLINE=1`, realnode.IMAGE_ENV). The input lies outside /tmp, which is private to
each container.
"""

from __future__ import annotations

import json
import time

import pytest

from embedjob import api
from support.cli import EMBEDJOB
from support.cli import run as run_cli
from support.kubectl import apply_job, condition, events_for, get_json, rayjobs, wait_for_condition
from support.polling import wait_until
from support.real_path import (MODEL, PodWatcher, batch_attempts, diagnostics, final_state, long_input, ray_pods,
                               sample, start_long_job, succeeded_batch_counts, wait_complete)
from support.real_path import pod_visible_dir, real_path  # noqa: F401 - fixtures
from support.sql import vectors

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
RECORDS = 60


def test_job_runs_to_complete_through_kuberay_pods_and_embedjob_logs_reads_its_kept_cluster(
        real_path, real_node, kuberay_operator, pod_database_url, pod_visible_dir):
    """A job through KubeRay's pods to Complete; then `embedjob logs`: the finished job's RayCluster is
    kept (ttlSecondsAfterFinished unset: 10 minutes) and the driver's log comes from the head's
    dashboard through the API server's service proxy, with KubeRay's token; once the cluster is gone,
    the command says so and where to look (the test node serves no pod logs, so the submitter
    fallback ends in that message here). ttlSecondsAfterFinished 0 is test_real_path_pod_settings'."""
    kube, namespace, operator = real_path
    uri, ids = sample(pod_visible_dir, RECORDS)
    started = time.monotonic()
    with PodWatcher(kube, namespace) as watcher:
        apply_job(kube, namespace, "pep", source={"uri": uri}, model=MODEL, batching={"batchSize": 16})
        job = wait_complete(kube, namespace, "pep", lambda: diagnostics(kube, namespace, real_node,
                                                                            kuberay_operator, operator, watcher))
        # the pods KubeRay made, run by the test node: head and worker Running, the submitter Succeeded
        time.sleep(1.5)
    print(f"\nreal path: Complete after {time.monotonic() - started:.0f}s; pods:\n{watcher.summary()}")

    status = job["status"]
    assert status["state"] == "Complete" and status["reason"] == "Succeeded", status
    assert status["jobDeploymentStatus"] == "Complete" and status["jobStatus"] == "SUCCEEDED"
    assert status["progress"]["recordsEmbedded"] == RECORDS and status["progress"]["recordsFailed"] == 0
    total = status["progress"]["batchesTotal"]
    assert status["progress"]["summary"] == f"{total}/{total} batches" and total >= RECORDS // 16
    assert condition(job, "Failed")["status"] == "False"

    rows = vectors(pod_database_url)
    assert sorted(r[0] for r in rows) == sorted(ids)  # one row per record, no duplicates
    assert {(r[1], r[2], float(r[3])) for r in rows} == {("all-MiniLM-L6-v2", 384, 1.0)}

    heads, workers, submitters = watcher.of_kind("head"), watcher.of_kind("worker"), watcher.submitters()
    assert len(heads) == 1 and len(workers) == 1 and len(submitters) == 1, watcher.summary()
    assert "Running" in watcher.phases[heads[0]] and "Running" in watcher.phases[workers[0]], watcher.summary()
    assert watcher.phases[submitters[0]][-1] == "Succeeded", watcher.summary()
    # the driver served its metrics on the head pod's IP and port driver-metrics, as the chart's PodMonitor scrapes
    assert "embedjob_batches_total" in watcher.driver_metrics.get(heads[0], ""), watcher.driver_metrics.keys()
    # token auth as the operator configured it: every Ray container and the submitter get KubeRay's
    # generated token from the cluster's Secret
    [rayjob] = rayjobs(kube, namespace)
    assert rayjob["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    cluster = status["rayClusterName"]
    for pod in [*heads, *workers, *submitters]:
        env = {e["name"]: e for e in watcher.pods[pod]["spec"]["containers"][0].get("env", [])}
        assert env["RAY_AUTH_MODE"]["value"] == "token", (pod, env)
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == cluster, (pod, env)
    # the database URL reached the driver from the Secret only
    assert pod_database_url not in json.dumps(rayjob)
    reasons = [e["reason"] for e in events_for(kube, namespace, "pep")]
    assert {"RayJobCreated", "JobRunning", "Succeeded"} <= set(reasons), reasons

    # `embedjob logs` from the kept cluster
    assert rayjob["spec"]["ttlSecondsAfterFinished"] == api.DEFAULT_TTL_SECONDS_AFTER_FINISHED
    env = {"KUBECONFIG": str(kube.kubeconfig)}
    logs = run_cli([*EMBEDJOB, "logs", "pep", "-n", namespace], env=env, timeout=120)
    assert logs.returncode == 0, logs.stderr
    events = [line for line in logs.stdout.splitlines() if "event=" in line]
    assert any("event=driver_starting" in line for line in events), logs.stdout[-3000:]
    assert any("event=run_finished" in line for line in events), logs.stdout[-3000:]
    # the same lines the submitter's `ray job logs --follow` printed
    submitter_log = real_node.container_log(namespace, submitters[0], "ray-job-submitter")
    assert all(line in submitter_log for line in events), (events, submitter_log[-3000:])
    assert kube.kubectl("get", "raycluster", cluster, "-n", namespace, check=False).returncode == 0  # still kept

    kube.kubectl("delete", "raycluster", cluster, "-n", namespace, "--timeout=120s", timeout=150)
    gone = run_cli([*EMBEDJOB, "logs", "pep", "-n", namespace], env=env, timeout=120)
    print(f"\nembedjob logs once the cluster is gone:\n{gone.stderr}")
    assert gone.returncode == 1 and "Traceback" not in gone.stderr, gone.stderr
    assert f"the RayCluster {cluster} is already gone" in gone.stderr
    assert f"kubectl logs job/{rayjob['metadata']['name']} -n {namespace}" in gone.stderr


def test_suspend_mid_job_deletes_the_pods_and_resume_finishes_on_new_ones(
        real_path, real_node, kuberay_operator, pod_database_url, pod_visible_dir):
    kube, namespace, operator = real_path
    uri, ids = long_input(pod_visible_dir)
    with PodWatcher(kube, namespace) as watcher:
        start_long_job(kube, namespace, "pausing", uri)
        first_heads = set(watcher.of_kind("head"))
        assert len(first_heads) == 1, watcher.summary()

        kube.kubectl("patch", "ej", "pausing", "-n", namespace, "--type=merge", "-p", '{"spec": {"suspend": true}}')
        job = wait_for_condition(kube, namespace, "pausing", "Suspended", timeout=300)
        assert job["status"]["state"] == "Suspended" and condition(job, "Running")["status"] == "False"
        assert job["status"]["observedGeneration"] == job["metadata"]["generation"]
        # KubeRay deleted the cluster; the garbage collector and the node removed its pods
        wait_until("the cluster's pods deleted", lambda: not ray_pods(kube, namespace), timeout=300)
        written_before = len(vectors(pod_database_url))
        assert 0 < written_before < len(ids), (written_before, len(ids))

        kube.kubectl("patch", "ej", "pausing", "-n", namespace, "--type=merge", "-p", '{"spec": {"suspend": false}}')
        job = wait_complete(kube, namespace, "pausing", lambda: diagnostics(kube, namespace, real_node,
                                                                            kuberay_operator, operator, watcher))
        time.sleep(1.5)
    print(f"\nsuspend/resume: {written_before} of {len(ids)} vectors before the suspension; pods:\n"
          f"{watcher.summary()}")
    assert job["status"]["state"] == "Complete", job["status"]
    assert condition(job, "Suspended")["status"] == "False"
    assert job["status"]["progress"]["recordsEmbedded"] == len(ids)
    rows = vectors(pod_database_url)
    assert len(rows) == len(ids) and sorted(r[0] for r in rows) == sorted(ids)  # resumed, nothing written twice
    heads = watcher.of_kind("head")
    assert len(heads) == 2 and set(heads) - first_heads, watcher.summary()  # a new cluster after the resume
    assert all("Running" in watcher.phases[h] for h in heads), watcher.summary()
    assert len(rayjobs(kube, namespace)) == 1
    reasons = [e["reason"] for e in events_for(kube, namespace, "pausing")]
    assert {"Suspending", "Suspended"} & set(reasons) and reasons.count("JobRunning") >= 2, reasons


def test_deleting_the_job_removes_rayjob_raycluster_and_pods(real_path, real_node, kuberay_operator,
                                                             pod_database_url, pod_visible_dir):
    kube, namespace, operator = real_path
    uri, _ = long_input(pod_visible_dir)
    start_long_job(kube, namespace, "doomed", uri)
    status = get_json(kube, "ej", "doomed", "-n", namespace)["status"]
    rayjob, cluster = status["rayJobName"], status["rayClusterName"]
    pods = ray_pods(kube, namespace)
    assert len(pods) == 2, pods
    submitters = [j["metadata"]["name"] for j in get_json(kube, "jobs", "-n", namespace)["items"]]
    assert len(submitters) == 1, submitters

    started = time.monotonic()
    kube.kubectl("delete", "ej", "doomed", "-n", namespace, "--timeout=300s", timeout=320)
    # the operator's finalizer deleted the RayJob; the garbage collector its RayCluster, submitter
    # Job and their pods, which the test node stopped
    for kind, name in (("rayjob", rayjob), ("raycluster", cluster), ("job", submitters[0]),
                       *(("pod", p) for p in pods)):
        kube.kubectl("wait", "--for=delete", f"{kind}/{name}", "-n", namespace, "--timeout=300s", timeout=320)
    print(f"\ndeletion: everything gone {time.monotonic() - started:.0f}s after kubectl delete")
    assert not get_json(kube, "pods", "-n", namespace)["items"]
    assert "CleanupTimedOut" not in [e["reason"] for e in events_for(kube, namespace, "doomed")]


def test_worker_pod_deleted_mid_job_loses_nothing_and_records_the_retry(
        real_path, real_node, kuberay_operator, pod_database_url, pod_visible_dir):
    kube, namespace, operator = real_path
    uri, ids = long_input(pod_visible_dir)
    with PodWatcher(kube, namespace) as watcher:
        start_long_job(kube, namespace, "lossy", uri)
        [worker] = watcher.of_kind("worker")
        kube.kubectl("delete", "pod", worker, "-n", namespace, "--wait=false")
        job = wait_complete(kube, namespace, "lossy", lambda: diagnostics(kube, namespace, real_node,
                                                                            kuberay_operator, operator, watcher))
        time.sleep(1.5)
    print(f"\nworker deleted: pods:\n{watcher.summary()}")
    workers = watcher.of_kind("worker")
    assert len(workers) == 2 and len(watcher.of_kind("head")) == 1, watcher.summary()  # KubeRay replaced it
    # the job's terminationGracePeriodSeconds (support.real_path.QUICK_STOP) reached KubeRay's pods
    assert {watcher.pods[pod]["spec"]["terminationGracePeriodSeconds"] for pod in workers} == {2}
    assert job["status"]["progress"]["recordsEmbedded"] == len(ids)
    rows = vectors(pod_database_url)
    assert len(rows) == len(ids) and sorted(r[0] for r in rows) == sorted(ids)  # nothing lost or duplicated
    outcomes = [o for o, _ in batch_attempts(pod_database_url)]
    assert "retry" in outcomes, outcomes  # the lost actor's batches were retried, and that is recorded


def test_fractional_gpus_schedule_two_worker_pods_with_one_gpu_each(real_path, real_node, kuberay_operator,
                                                                     pod_visible_dir):
    """gpusPerActor 0.5 x 4 replicas: 2 worker pods, each asking for one nvidia.com/gpu, scheduled
    on the node that advertises 4 and running Ray with 1 GPU each. The actors would load the model
    on CUDA, which this machine lacks: the job itself is not run to completion here."""
    kube, namespace, operator = real_path
    uri, _ = sample(pod_visible_dir, 60)
    apply_job(kube, namespace, "halves", source={"uri": uri}, model=MODEL,
              workers={"replicas": 4, "gpusPerActor": 0.5, "cpusPerActor": 0.5})

    def workers_running():
        items = get_json(kube, "pods", "-n", namespace, "-l", "ray.io/node-type=worker")["items"]
        return items if len(items) == 2 and all(p["status"].get("phase") == "Running" for p in items) else None

    pods = wait_until("2 worker pods Running", workers_running, timeout=300)
    for pod in pods:
        container = pod["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1", container["resources"]
        assert pod["spec"]["nodeName"] == real_node.name
        assert "--num-gpus=1" in " ".join(container.get("args", []) + container.get("command", [])), container
    kube.kubectl("delete", "ej", "halves", "-n", namespace, "--timeout=300s", timeout=320)


def test_head_pod_deleted_mid_job_resumes_without_recomputing_finished_batches(
        real_path, real_node, kuberay_operator, pod_database_url, pod_visible_dir):
    kube, namespace, operator = real_path
    uri, ids = long_input(pod_visible_dir)
    with PodWatcher(kube, namespace) as watcher:
        start_long_job(kube, namespace, "headless", uri, retry={"backoffLimit": 2})
        [head] = watcher.of_kind("head")
        kube.kubectl("delete", "pod", head, "-n", namespace, "--wait=false")
        job = final_state(kube, namespace, "headless")
        time.sleep(1.5)
        print(f"\nhead deleted: {json.dumps(job['status'], indent=1)}\npods:\n{watcher.summary()}")
        assert job["status"]["state"] == "Complete", (job["status"], diagnostics(
            kube, namespace, real_node, kuberay_operator, operator, watcher))
    # KubeRay started a new head; the submitter that followed the lost one failed and a new
    # submitter pod ran the driver again, which skipped the batches already done
    heads, submitters = watcher.of_kind("head"), watcher.submitters()
    assert len(heads) == 2, watcher.summary()
    assert len(submitters) >= 2 and "Succeeded" in [watcher.phases[s][-1] for s in submitters], watcher.summary()
    assert job["status"]["progress"]["recordsEmbedded"] == len(ids)
    rows = vectors(pod_database_url)
    assert len(rows) == len(ids) and sorted(r[0] for r in rows) == sorted(ids)
    succeeded = succeeded_batch_counts(pod_database_url)
    assert succeeded and set(succeeded.values()) == {1}  # no finished batch computed twice
