"""Kueue preempts a running job on the real path, and the job later finishes with exact vectors.

Real kube-apiserver, kube-scheduler and kube-controller-manager, the real KubeRay operator, real
Kueue (its controllers, built from its Go module: tests/envtest/kueue.py), the operator as a
process, and the test node running KubeRay's head, worker and submitter pods. The LocalQueue's
ClusterQueue has quota for one job (support/kueue.py): a low-priority job is admitted and writes
batches; a high-priority one preempts it (Kueue suspends its RayJob, KubeRay deletes its
RayCluster and the node stops its pods, killing its driver mid-run); when the urgent job is done,
Kueue readmits the first, KubeRay starts the same RayJob on a new cluster, and its driver resumes
the run. What was lost is what the first driver had dispatched and not committed: read from the
driver's own log (Ray's job-driver log on the first head pod, kept by the test node) against the
batch rows committed before the readmission.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from embedjob import api
from embedjob_worker.encode.model import load_model, resolve_model
from support.driver_crash import committed_batches, dispatched_batches
from support.kubectl import apply_job, condition, get_json, rayjobs
from support.kueue import (WorkloadLog, apply_kueue_objects, job_status, preempted_rayjob, queue_spec, wait_state,
                           workload_of)
from support.manifests import MINIMAL_SPEC
from support.polling import wait_until
from support.real_path import (MODEL, PodWatcher, diagnostics, driver_log, long_input, ray_pods, sample,
                               start_long_job, succeeded_batch_counts, wait_complete)
from support.real_path import pod_visible_dir, real_path  # noqa: F401 - fixtures
from support.sql import query

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
# Long enough to be preempted mid-run on an idle 2-core machine too, with a wide margin: with 600 records the first
# driver had written 40 (10 batches) when Kueue's preemption stopped its pods (2 s after their deletion,
# start_long_job); with 1,000 the test took 165 s in CI. Every vector is encoded again in the test.
RECORDS = 400
BATCH_SIZE = 4
MAX_IN_FLIGHT = 2
COMMITTED_BEFORE_PREEMPTION = 5  # batches the first job has written when the urgent one comes


def heads_of(watcher: PodWatcher, rayjob: str) -> list[str]:
    """The head pods of a RayJob's clusters (KubeRay names them RayJob name + suffix), in the order seen."""
    return [pod for pod in watcher.of_kind("head") if watcher.labels[pod].get("ray.io/cluster", "").startswith(
        f"{rayjob}-")]


def vector_rows(database_url: str) -> list:
    return query(database_url, "SELECT record_id, text, model, revision, embedding::text AS embedding"
                               " FROM embeddings WHERE collection = 'default' ORDER BY record_id")


def test_a_job_preempted_by_kueue_resumes_on_readmission_and_finishes_with_exact_vectors(
        real_path, real_node, kuberay_operator, kueue, pod_database_url, pod_visible_dir):
    kube, namespace, operator = real_path
    apply_kueue_objects(kube, namespace)
    uri, ids = long_input(pod_visible_dir, RECORDS)
    urgent_uri, _ = sample(pod_visible_dir, 24)
    started = time.monotonic()
    with PodWatcher(kube, namespace) as watcher, WorkloadLog(kube, namespace) as workloads:
        def explain() -> str:
            return diagnostics(kube, namespace, real_node, kuberay_operator, operator, watcher)

        try:
            # 1. first (low priority) is admitted at once and writes batches through the real pods
            start_long_job(kube, namespace, "first", uri,
                           batching={"maxInFlight": MAX_IN_FLIGHT, "batchSize": BATCH_SIZE},
                           **queue_spec(namespace, "low"))
            first = job_status(kube, namespace, "first")
            job_key, rayjob = get_json(kube, "ej", "first", "-n", namespace)["metadata"]["uid"], first["rayJobName"]
            entrypoint = rayjobs(kube, namespace)[0]["spec"]["entrypoint"]
            wait_until(f"{COMMITTED_BEFORE_PREEMPTION} batch rows committed", lambda: len(committed_batches(
                pod_database_url, job_key)) >= COMMITTED_BEFORE_PREEMPTION, timeout=300)
            [first_head] = heads_of(watcher, rayjob)

            # 2. urgent (high priority) preempts it: Kueue evicts first's Workload and suspends its
            #    RayJob, KubeRay deletes its RayCluster, the node stops its pods (and its driver)
            apply_job(kube, namespace, "urgent", source={"uri": urgent_uri}, model=MODEL, sink={
                "collection": "urgent"}, ttlSecondsAfterFinished=0, **queue_spec(namespace, "high"))
            preempted = wait_state(kube, namespace, "first", "Suspended", "Preempted", workloads, timeout=180)
            assert condition({"status": preempted}, "Suspended")["status"] == "True", preempted
            evicted = wait_until("first's Workload Evicted by preemption", lambda: (lambda wl: wl if wl and (
                condition(wl, "Evicted") or {}).get("reason") == "Preempted" else None)(
                workload_of(kube, namespace, rayjob)), timeout=60)
            assert condition(evicted, "Evicted")["status"] == "True" and condition(evicted, "Preempted")["status"] \
                == "True", evicted["status"]
            wait_until("first's RayJob suspended, its RayCluster deleted",
                       lambda: preempted_rayjob(kube, namespace, "first"), timeout=180)
            assert get_json(kube, "rayclusters", "-n", namespace, "-l",
                            f"ray.io/originated-from-cr-name={rayjob}")["items"] == []
            wait_until("first's pods gone", lambda: not [p for p in ray_pods(kube, namespace)
                                                         if p.startswith(f"{rayjob}-")], timeout=300)
            committed_before = committed_batches(pod_database_url, job_key)  # the first driver is dead now
            written_before = len(vector_rows(pod_database_url))
            assert 0 < written_before < len(ids), (written_before, len(ids))
            assert job_status(kube, namespace, "first")["state"] == "Suspended"

            # 3. urgent runs to Complete; then first is readmitted, resumes and completes
            wait_complete(kube, namespace, "urgent", explain)
            done = wait_complete(kube, namespace, "first", explain)
            time.sleep(1.5)
        except Exception:
            workloads.dump()
            raise
    elapsed = time.monotonic() - started
    workloads.dump()
    first_states = workloads.states_of(rayjob)
    print(f"\nKueue preemption on the real path: Complete after {elapsed:.0f}s; {len(committed_before)} batches "
          f"({written_before} of {len(ids)} vectors) committed before the preemption\nfirst's Workload states:\n  "
          + "\n  ".join(first_states) + f"\nfirst's states: {watcher.job_states['first']}\npods:\n{watcher.summary()}")

    # the same RayJob and entrypoint ran again on a new cluster with new pods
    status = done["status"]
    assert status["state"] == "Complete" and status["reason"] == "Succeeded", status
    assert status["rayJobName"] == rayjob and status["startTime"] == preempted["startTime"]
    [again] = [rj for rj in rayjobs(kube, namespace) if rj["metadata"]["name"] == rayjob]
    assert again["spec"]["entrypoint"] == entrypoint
    heads = heads_of(watcher, rayjob)
    assert len(heads) == 2 and heads[0] == first_head, watcher.summary()
    states = [state for state, _ in watcher.job_states["first"] if state]
    assert "Suspended" in states and states[-1] == "Complete", watcher.job_states

    # exactly one vector per record, equal to a direct encode with the same model
    rows = vector_rows(pod_database_url)
    assert [r.record_id for r in rows] == sorted(ids)
    resolved = resolve_model(api.parse_spec({**MINIMAL_SPEC, "model": MODEL}).model)
    assert {(r.model, r.revision) for r in rows} == {(resolved.name, resolved.revision)}
    model = load_model(resolved, device="cpu")
    reference = model.encode([r.text for r in rows], normalize_embeddings=resolved.normalize, convert_to_numpy=True)
    np.testing.assert_allclose(np.array([json.loads(r.embedding) for r in rows]), reference, atol=1e-5)
    assert status["progress"]["recordsEmbedded"] == len(ids) and status["progress"]["recordsFailed"] == 0

    # every batch committed once, and the work recomputed after the readmission is at most the
    # batches the first driver had in flight (dispatched, not committed) when it was killed
    per_batch = {batch: n for (key, batch), n in succeeded_batch_counts(pod_database_url).items() if key == job_key}
    assert len(per_batch) == status["progress"]["batchesTotal"] and set(per_batch.values()) == {1}, per_batch
    before, after = (dispatched_batches(driver_log(real_node, namespace, head)) for head in heads)
    lost = before - committed_before
    assert committed_before <= before and not committed_before & after, "a committed batch was dispatched again"
    assert before & after == lost and len(lost) <= MAX_IN_FLIGHT, (len(lost), MAX_IN_FLIGHT)
    assert after == set(per_batch) - committed_before
    print(f"recomputed after the readmission: {len(lost)} batches (maxInFlight {MAX_IN_FLIGHT}); the first driver "
          f"dispatched {len(before)}, the second {len(after)} of {len(per_batch)}")

    # what Kueue did to the Workloads: first admitted, evicted by preemption, readmitted, finished;
    # urgent admitted and finished
    def first_seen(fragment: str, states: list[str]) -> int:
        return next((i for i, state in enumerate(states) if fragment in state), -1)

    admitted = first_seen("Admitted=True", first_states)
    evicted_at = first_seen("Evicted=True(Preempted)", first_states)
    readmitted = next((i for i, state in enumerate(first_states) if i > evicted_at and "Admitted=True" in state
                       and "Evicted=True" not in state), -1)
    assert 0 <= admitted < evicted_at < readmitted, first_states
    assert "Preempted=True" in first_states[evicted_at], first_states
    assert "Finished=True" in first_states[-1], first_states
    urgent_states = workloads.states_of(job_status(kube, namespace, "urgent")["rayJobName"])
    assert first_seen("Admitted=True", urgent_states) >= 0 and "Finished=True" in urgent_states[-1], urgent_states
