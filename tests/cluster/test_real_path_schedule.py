"""A scheduled job through the real path (issue 31 item 1): a run on KubeRay's pods, the next after it; its status.

`* * * * *`, concurrencyPolicy Forbid: the first tick's run, a child EmbeddingJob whose RayJob (the scheduled job has
none of its own) KubeRay runs on the test node's pods, writes its vectors to PostgreSQL and completes; the next tick's
run is created only after that (when the run outlasts the minute, as on a loaded machine, Forbid holds the tick until
it ends; on an idle one the run ends first). The scheduled job's status is read from a watch, every version the
operator wrote, since between a run's end and a held tick's start it is `Scheduled` for seconds only. The next run is
not waited for (incremental runs, three ticks, the history limit and an operator restart are
test_operator_schedule.py's, on the stand-in): the schedule is suspended, which takes its next tick from the status,
and the namespace's deletion ends the run.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from controller.scheduled_runs import ANNOTATION_SCHEDULED_TIME, LABEL_SCHEDULED_BY_UID
from controller.times import parse_time
from support.kubectl import Watch, apply_job, condition, events_for, get_json, rayjobs
from support.polling import wait_until
from support.real_path import MODEL, PodWatcher, diagnostics, sample, wait_complete
from support.real_path import pod_visible_dir, real_path  # noqa: F401 - fixtures
from support.sql import vectors

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
RECORDS = 40


def test_a_scheduled_run_completes_on_kuberay_pods_and_forbid_starts_the_next_only_after_it(
        real_path, real_node, kuberay_operator, pod_database_url, pod_visible_dir):
    kube, namespace, operator = real_path
    uri, ids = sample(pod_visible_dir, RECORDS)
    started = time.monotonic()
    uid = apply_job(kube, namespace, "sync", source={"uri": uri}, model=MODEL, batching={"batchSize": 16},
                    ttlSecondsAfterFinished=0,  # a run's cluster goes when it ends: the next run's gets the cores
                    schedule={"cron": "* * * * *", "concurrencyPolicy": "Forbid",
                              "successfulRunsHistoryLimit": 1})["metadata"]["uid"]

    def runs() -> list[dict]:
        return sorted(get_json(kube, "ej", "-n", namespace, "-l", f"{LABEL_SCHEDULED_BY_UID}={uid}")["items"],
                      key=lambda run: run["metadata"]["name"])

    def paused(active: str) -> dict | None:
        """The scheduled job once its status has `active` running and no next tick."""
        job = get_json(kube, "ej", "sync", "-n", namespace)
        schedule = job["status"]["schedule"]
        return job if schedule.get("active") == [active] and "nextScheduleTime" not in schedule else None

    with Watch(kube, "ej", "sync", "-n", namespace) as watch, PodWatcher(kube, namespace) as watcher:
        first = wait_until("the first tick's run", runs, timeout=90, interval=1)[0]["metadata"]["name"]
        ticked = time.monotonic()
        run1 = wait_complete(kube, namespace, first, lambda: diagnostics(kube, namespace, real_node,
                                                                         kuberay_operator, operator, watcher))
        [rayjob] = [r for r in rayjobs(kube, namespace) if r["metadata"]["ownerReferences"][0]["name"] == first]
        rows = vectors(pod_database_url)
        second = wait_until("the next tick's run", lambda: runs()[1:], timeout=90, interval=1)[0]
        # no third run: suspended, the schedule starts nothing; the started run goes on
        kube.kubectl("patch", "ej", "sync", "-n", namespace, "--type=merge", "-p", '{"spec": {"suspend": true}}')
        job = wait_until("the status with the next run active and no next tick",
                         lambda: paused(second["metadata"]["name"]), timeout=30)
    print(f"\nscheduled: the first run after {ticked - started:.0f}s, the test done after "
          f"{time.monotonic() - started:.0f}s;\n{watcher.summary()}")

    # the first tick's run: a child job with the scheduled job's spec, its RayJob run by KubeRay's pods
    tick1, completed1 = run1["metadata"]["annotations"][ANNOTATION_SCHEDULED_TIME], run1["status"]["completionTime"]
    assert run1["metadata"]["ownerReferences"][0]["uid"] == uid and "schedule" not in run1["spec"]
    assert run1["status"]["state"] == "Complete" and run1["status"]["reason"] == "Succeeded", run1["status"]
    progress = run1["status"]["progress"]
    assert (progress["recordsEmbedded"], progress["recordsNew"], progress["recordsFailed"]) == (RECORDS, RECORDS, 0)
    assert sorted(r[0] for r in rows) == sorted(ids)  # one row per record, no duplicates
    assert {(r[1], r[2], float(r[3])) for r in rows} == {("all-MiniLM-L6-v2", 384, 1.0)}
    assert rayjob["metadata"]["name"] == run1["status"]["rayJobName"] and rayjob["spec"]["ttlSecondsAfterFinished"] == 0
    [submitter] = [p for p in watcher.submitters() if p.startswith(rayjob["metadata"]["name"])]
    assert watcher.phases[submitter][-1] == "Succeeded", watcher.summary()

    # Forbid: the next tick's run was created once the first had completed; the operator never listed two active
    name2, tick2 = second["metadata"]["name"], second["metadata"]["annotations"][ANNOTATION_SCHEDULED_TIME]
    print(f"first run {tick1} to {completed1}; the next ({tick2}) created {second['metadata']['creationTimestamp']}")
    assert parse_time(second["metadata"]["creationTimestamp"]) >= parse_time(completed1), (second, completed1)
    assert parse_time(tick2) >= parse_time(tick1) + timedelta(minutes=1)
    statuses = [version["status"] for version in watch.versions if "schedule" in version.get("status", {})]
    assert all(len(s["schedule"].get("active", [])) <= 1 for s in statuses), statuses

    # the scheduled job's status: Scheduled once the first run had completed (before the next tick's started)
    [between, *_] = [s for s in statuses if {"name": first, "scheduledTime": tick1, "state": "Complete",
                                              "completionTime": completed1} in s["schedule"]["runs"]]
    assert (between["state"], between["reason"]) == ("Scheduled", "Scheduled"), statuses
    assert between["schedule"]["runs"] == [{"name": first, "scheduledTime": tick1, "state": "Complete",
                                            "completionTime": completed1}] and not between["schedule"].get("active")
    assert (between["schedule"]["lastScheduleTime"], between["schedule"]["lastSuccessfulTime"]) == (tick1, completed1)
    assert parse_time(between["schedule"]["nextScheduleTime"]) > parse_time(completed1)
    # then Running the next tick's run, and paused: no next tick
    schedule = job["status"]["schedule"]
    assert (job["status"]["state"], job["status"]["reason"]) == ("Running", "RunActive"), job["status"]
    assert schedule["active"] == [name2] and [r["name"] for r in schedule["runs"]] == [name2, first]
    assert (schedule["lastScheduleTime"], schedule["lastSuccessfulTime"]) == (tick2, completed1)
    events = events_for(kube, namespace, "sync")
    started_events = [e["message"] for e in events if e["reason"] == "RunStarted"]
    assert len(started_events) == 2 and all(any(name in m for m in started_events) for name in (first, name2))
    # accepted as a schedule: it has no RayJob of its own
    assert condition(job, "Accepted")["reason"] == "ScheduleAccepted"
    assert "RayJobCreated" not in [e["reason"] for e in events], events
