"""The operator against the real API server with two namespaces it watches: a RayJob made in one
namespace never stands in for, or steers, another namespace's job (issue 26, item 1).

The attacker may create RayJobs in `team-a` only. The victim's job in `team-b` is visible to
whoever can read it (its uid is in its Events, its pods' labels and the run table's job key). The
forged RayJob in team-a carries the operator's labels, the victim's uid as its job label and as a
controller ownerReference, and the name of an unrelated RayJob in team-b.
"""

from __future__ import annotations

import time
import uuid

import pytest

from plugins.operator_process import namespaced_grant
from support.kubectl import apply_job, create_database_secret, get_json, rayjobs, wait_for_condition
from support.polling import wait_until
from support.tenancy import apply, forged_rayjob, rayjob

pytestmark = pytest.mark.k8s

DB_URL = "postgresql://writer:secret@db.example:5432/embed"
UNRELATED = "nightly-report"  # team-b's own RayJob, nothing to do with embedjob


def test_a_forged_rayjob_in_another_namespace_neither_stands_in_for_nor_steers_a_job(kube, namespace, start_operator):
    team_a, team_b = namespace, f"team-b-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", team_b)
    try:
        create_database_secret(kube, team_b, DB_URL)
        apply(kube, rayjob(team_b, UNRELATED, suspend=True), *namespaced_grant(team_b, team_a))
        unrelated_uid = get_json(kube, "rayjob", UNRELATED, "-n", team_b)["metadata"]["uid"]
        # The victim's job exists before the operator runs, so the forged RayJob is in the operator's
        # watch from its first moment (as when the attacker is quicker than the operator).
        victim = apply_job(kube, team_b, "victim")
        uid = victim["metadata"]["uid"]
        apply(kube, forged_rayjob(team_a, UNRELATED, victim))

        operator = start_operator(kube, team_a, EMBEDJOB_WATCH_NAMESPACES=f"{team_a},{team_b}")
        job = wait_for_condition(kube, team_b, "victim", "Accepted")
        own = wait_until("the victim's own RayJob", lambda: [r for r in rayjobs(kube, team_b)
                                                              if r["metadata"]["name"] != UNRELATED])
        [own] = own
        assert own["metadata"]["ownerReferences"][0]["uid"] == uid
        job = wait_until("rayJobName in the status", lambda: (lambda j: j if j.get("status", {}).get(
            "rayJobName") else None)(get_json(kube, "ej", "victim", "-n", team_b)))
        assert job["status"]["rayJobName"] == own["metadata"]["name"] != UNRELATED
        # team-b's unrelated RayJob: the same object, still suspended, as its owner left it
        time.sleep(2)
        untouched = get_json(kube, "rayjob", UNRELATED, "-n", team_b)
        assert untouched["metadata"]["uid"] == unrelated_uid and untouched["spec"]["suspend"] is True

        kube.kubectl("delete", "ej", "victim", "-n", team_b, "--timeout=60s", timeout=90)
        assert [r["metadata"]["name"] for r in rayjobs(kube, team_b)] == [UNRELATED]
        assert get_json(kube, "rayjob", UNRELATED, "-n", team_b)["metadata"]["uid"] == unrelated_uid
        log = operator.log()
        assert "Traceback" not in log, log[-3000:]
    finally:
        kube.kubectl("delete", "namespace", team_b, "--wait=false", "--ignore-not-found", check=False)
