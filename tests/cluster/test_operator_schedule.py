"""Issue 31 item 1: a job on a one-minute schedule, on the real API server with the operator as a ServiceAccount;
`RayJobRunner` plays KubeRay + kubelet (each run's driver runs for real on a local Ray, with the packaged model and
PostgreSQL). Three ticks, each an incremental run; concurrencyPolicy Forbid holds a tick while a run is active and
starts it when that run ends, across an operator killed meanwhile (the operator's pending ticks metric says 1 while
it waits); the history limit deletes the oldest completed run; the status follows, and says Suspended once the
schedule is."""

from __future__ import annotations

import signal
import time
from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.scheduled_runs import ANNOTATION_SCHEDULED_TIME, LABEL_SCHEDULED_BY_UID
from support.kubectl import apply_job, events_for, get_json
from support.polling import BackgroundPoller, wait_until
from support.standin_jobs import MODEL, sample

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


class RunWatcher(BackgroundPoller):
    """Every run seen (name -> its last status and tick) and the most runs active at once."""

    def __init__(self, kube, namespace: str, uid: str):
        super().__init__()
        self.kube, self.namespace, self.uid = kube, namespace, uid
        self.runs: dict[str, dict] = {}
        self.most_active = 0

    def poll(self) -> None:
        jobs = get_json(self.kube, "ej", "-n", self.namespace, "-l", f"{LABEL_SCHEDULED_BY_UID}={self.uid}")["items"]
        active = 0
        for job in jobs:
            state = (job.get("status") or {}).get("state")
            self.runs[job["metadata"]["name"]] = {"status": job.get("status") or {},
                                                  "tick": job["metadata"]["annotations"][ANNOTATION_SCHEDULED_TIME]}
            active += state not in ("Complete", "Failed")
        self.most_active = max(self.most_active, active)

    def completed(self) -> list[str]:
        return sorted(name for name, run in self.runs.items() if run["status"].get("state") == "Complete")


def pending_ticks(operator, namespace: str) -> float | None:
    """The job's embedjob_schedule_pending_ticks as the operator serves it (None: no such series)."""
    return next((sample.value for family in text_string_to_metric_families(operator.metrics())
                 for sample in family.samples if sample.name == "embedjob_schedule_pending_ticks"
                 and sample.labels == {"namespace": namespace, "embeddingjob": "sync"}), None)


def suspended_and_idle(kube, namespace: str) -> bool:
    status = get_json(kube, "ej", "sync", "-n", namespace).get("status") or {}
    return status.get("state") == "Suspended" and not status["schedule"].get("active")


def tick_of(name: str) -> datetime:
    return datetime.fromtimestamp(int(name.rsplit("-", 1)[1]) * 60, timezone.utc)


def test_three_ticks_forbid_holds_a_tick_while_a_run_is_active_and_history_is_pruned(e2e, tmp_path):
    kube, namespace, operator, runner = e2e
    uri, ids = sample(tmp_path, 40)
    apply_job(kube, namespace, "sync", source={"uri": uri}, model=MODEL, batching={"batchSize": 16},
              schedule={"cron": "* * * * *", "successfulRunsHistoryLimit": 2})
    uid = get_json(kube, "ej", "sync", "-n", namespace)["metadata"]["uid"]
    with RunWatcher(kube, namespace, uid) as watcher:
        first = wait_until("the first tick's run", lambda: sorted(watcher.runs), timeout=90)[0]
        # Nothing runs RayJobs yet: the first run stays active through the next tick, which Forbid holds.
        held_until = tick_of(first) + timedelta(seconds=70)
        time.sleep(max(0.0, (held_until - datetime.now(timezone.utc)).total_seconds()))
        assert sorted(watcher.runs) == [first], watcher.runs
        job = get_json(kube, "ej", "sync", "-n", namespace)
        assert job["status"]["state"] == "Running" and job["status"]["schedule"]["active"] == [first], job["status"]
        # the held tick, as the operator's metric says (once its next look at the job has counted it)
        wait_until("one pending tick in the metric", lambda: pending_ticks(operator, namespace) == 1.0, timeout=30)

        operator.restart(signal.SIGKILL)  # what it knew of the schedule is what is stored: no tick twice
        runner()  # KubeRay and the kubelet arrive: the first run runs, then the held tick's, then the next tick's
        wait_until("three completed runs", lambda: len(watcher.completed()) >= 3, timeout=360)
        first_run_gone = wait_until("the history limit's delete", lambda: first not in {
            job["metadata"]["name"] for job in get_json(kube, "ej", "-n", namespace)["items"]}, timeout=30)
        running = get_json(kube, "ej", "sync", "-n", namespace)["status"]["schedule"]
        assert running["lastSuccessfulTime"] and running["nextScheduleTime"] > running["lastScheduleTime"], running
        # The status is compared with the runs below: suspended, no tick starts a run between those reads (on a slow
        # machine a tick landed between them); the run already started goes on and ends.
        kube.kubectl("patch", "ej", "sync", "-n", namespace, "--type=merge", "-p", '{"spec": {"suspend": true}}')
        wait_until("the schedule suspended with no run active", lambda: suspended_and_idle(kube, namespace), timeout=180)
    watcher.poll()  # the last look, every run ended
    assert watcher.most_active == 1, watcher.runs  # Forbid: never two runs at once

    completed = watcher.completed()
    second = completed[1]
    # The held tick's run starts once the first ended, for the latest tick due then (CronJob's rule): on a machine
    # where the first run outlasts two ticks, the later one (seen in CI: 10:41 after a first run of 10:39).
    ended = datetime.fromisoformat(watcher.runs[first]["status"]["completionTime"])
    started = datetime.fromisoformat(watcher.runs[second]["status"]["startTime"])
    assert ended <= started and tick_of(first) < tick_of(second) <= started, (first, second, ended, started)
    progress = {name: watcher.runs[name]["status"]["progress"] for name in completed[:3]}
    assert progress[first]["recordsNew"] == len(ids), progress  # the first run embeds everything
    for name in completed[1:3]:  # the later ones are incremental: nothing changed, nothing re-embedded
        assert (progress[name]["recordsUnchanged"], progress[name]["recordsNew"]) == (len(ids), 0), progress

    kept = get_json(kube, "ej", "-n", namespace, "-l", f"{LABEL_SCHEDULED_BY_UID}={uid}")["items"]
    kept_completed = sorted(j["metadata"]["name"] for j in kept if (j.get("status") or {}).get("state") == "Complete")
    assert first_run_gone and first not in {j["metadata"]["name"] for j in kept}  # the oldest completed run
    assert kept_completed == completed[-2:]  # the two newest completed kept (successfulRunsHistoryLimit 2)

    status = get_json(kube, "ej", "sync", "-n", namespace)["status"]
    schedule = status["schedule"]
    newest = max(watcher.runs, key=tick_of)
    assert schedule["lastScheduleTime"] == watcher.runs[newest]["tick"]
    assert not schedule.get("nextScheduleTime"), schedule  # none while suspended
    assert [run["name"] for run in schedule["runs"]] == sorted((j["metadata"]["name"] for j in kept), reverse=True)
    assert (status["state"], status["reason"]) == ("Suspended", "ScheduleSuspended"), status
    started = [e["message"] for e in events_for(kube, namespace, "sync") if e["reason"] == "RunStarted"]
    assert len(started) >= 3 and any(first in message for message in started), started
