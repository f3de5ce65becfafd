"""Two teams on the real API server with RBAC, each user with rights in their own namespace only, one operator
watching both: nothing one team does reaches the other team's jobs or RayJobs (issue 26's tenant isolation suite).

The same job name in both namespaces, a RayJob forged in one namespace with the other team's job uid (a leaked
uid: it is in that job's Events, its pods' labels and the run table) and the other team's RayJob name, direct
attempts across the namespace, and each team suspending and deleting its own job. The shared vectors table (a
tenant's table resolved in its own schema) needs a driver run: tests/integration/test_tenant_tables.py.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from plugins.operator_process import namespaced_grant
from support.kubectl import get_json, rayjobs
from support.manifests import ej_manifest
from support.polling import wait_until
from support.tenancy import apply, forged_rayjob, tenant_user

pytestmark = pytest.mark.k8s

DB_URL = "postgresql://writer:secret@db.example:5432/embed"


def named_job(kube, namespace: str) -> dict | None:
    """The namespace's job `pep` once its status names its RayJob."""
    job = get_json(kube, "ej", "pep", "-n", namespace)
    return job if (job.get("status") or {}).get("rayJobName") else None


def rayjob_summary(kube, namespace: str) -> list[tuple]:
    """Each RayJob of the namespace as (name, uid, its controller owner's uid, spec.suspend)."""
    return sorted((r["metadata"]["name"], r["metadata"]["uid"],
                   [o["uid"] for o in r["metadata"].get("ownerReferences", []) if o.get("controller")],
                   r["spec"].get("suspend")) for r in rayjobs(kube, namespace))


def refused(kube, user: str, *args: str, input: str | None = None) -> str:
    """kubectl as `user`; the API server's refusal (it must refuse)."""
    result = kube.kubectl(*args, input=input, kubeconfig=user, check=False)
    assert result.returncode != 0, f"kubectl {' '.join(args)} was allowed: {result.stdout}"
    return result.stderr


def test_two_teams_with_rights_in_their_own_namespace_never_reach_each_other(kube, namespace, start_operator):
    team_a, team_b = namespace, f"team-b-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", team_b)
    try:
        apply(kube, *namespaced_grant(team_b, team_a))
        alice, bob = tenant_user(kube, team_a, "alice"), tenant_user(kube, team_b, "bob")
        for team, user in ((team_a, alice), (team_b, bob)):
            kube.kubectl("create", "secret", "generic", "embedjob-db", "-n", team, f"--from-literal=url={DB_URL}",
                         kubeconfig=user)
        operator = start_operator(kube, team_a, EMBEDJOB_WATCH_NAMESPACES=f"{team_a},{team_b}")

        # The same name in both namespaces, each job created by its own team: one RayJob each, in its own
        # namespace, owned by its own job, under a name of its own.
        for team, user in ((team_a, alice), (team_b, bob)):
            kube.kubectl("apply", "-n", team, "-f", "-", input=ej_manifest("pep"), kubeconfig=user)
        jobs = {team: wait_until(f"{team}/pep's RayJob in its status", lambda team=team: named_job(kube, team))
                for team in (team_a, team_b)}
        for team, job in jobs.items():
            [(name, _, owners, _)] = rayjob_summary(kube, team)
            assert (name, owners) == (job["status"]["rayJobName"], [job["metadata"]["uid"]])
        assert jobs[team_a]["status"]["rayJobName"] != jobs[team_b]["status"]["rayJobName"]
        team_b_before = rayjob_summary(kube, team_b)

        # Alice straight at team-b: every read and write refused by the API server.
        for args in (("get", "ej", "pep", "-n", team_b), ("get", "events", "-n", team_b),
                     ("patch", "ej", "pep", "-n", team_b, "--type=merge", "-p", '{"spec":{"suspend":true}}'),
                     ("delete", "ej", "pep", "-n", team_b, "--wait=false"),
                     ("delete", "rayjob", team_b_before[0][0], "-n", team_b, "--wait=false")):
            assert "forbidden" in refused(kube, alice, *args).lower()
        assert "forbidden" in refused(kube, alice, "apply", "-n", team_b, "-f", "-",
                                      input=ej_manifest("intruder")).lower()

        # Alice through the operator, with team-b's leaked uid: a RayJob in her namespace posing as the
        # operator's RayJob of team-b's job, under that RayJob's name. It stands in for nothing.
        apply(kube, forged_rayjob(team_a, team_b_before[0][0], jobs[team_b]), kubeconfig=alice)
        time.sleep(3)  # several syncs (progress interval 1 s) with the forged RayJob in the operator's watch
        assert named_job(kube, team_b)["status"]["rayJobName"] == team_b_before[0][0]
        assert rayjob_summary(kube, team_b) == team_b_before

        # Bob suspends his job: his RayJob is suspended, and only his.
        kube.kubectl("patch", "ej", "pep", "-n", team_b, "--type=merge", "-p", json.dumps({"spec": {"suspend": True}}),
                     kubeconfig=bob)
        wait_until("team-b's RayJob suspended", lambda: rayjob_summary(kube, team_b)[0][3] is True)
        [(name, uid, owners, _)] = rayjob_summary(kube, team_b)
        assert (name, uid, owners) == team_b_before[0][:3]

        # Alice deletes her job: her RayJob goes; team-b's job and RayJob stay as they were.
        kube.kubectl("delete", "ej", "pep", "-n", team_a, "--timeout=60s", kubeconfig=alice, timeout=90)
        alice_rayjobs = [r[0] for r in rayjob_summary(kube, team_a)]
        assert jobs[team_a]["status"]["rayJobName"] not in alice_rayjobs
        assert get_json(kube, "ej", "pep", "-n", team_b)["metadata"]["uid"] == jobs[team_b]["metadata"]["uid"]
        [(name, uid, owners, suspend)] = rayjob_summary(kube, team_b)
        assert (name, uid, owners, suspend) == (*team_b_before[0][:3], True)

        # Bob deletes his: his RayJob goes with it.
        kube.kubectl("delete", "ej", "pep", "-n", team_b, "--timeout=60s", kubeconfig=bob, timeout=90)
        assert rayjob_summary(kube, team_b) == []
        log = operator.log()
        assert "Traceback" not in log, log[-3000:]
    finally:
        kube.kubectl("delete", "namespace", team_b, "--wait=false", "--ignore-not-found", check=False)
