"""The Helm chart installed into the real API server of tests/envtest: every object, what
its ServiceAccount may do, and the operator running as the chart configures it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from plugins.operator_process import OperatorProcess
from plugins.standin import RayJobRunner
from support.chart import RELEASE, assert_refused, container_env, helm, the, values_args
from support.kubectl import apply_job, create_database_secret, get_json, rayjobs, wait_for_condition
from support.net import free_port
from support.paths import CHART, REPO, SAMPLE
from support.polling import wait_until
from support.sql import query


def install(kube, namespace: str, values: dict | None = None, command: str = "install") -> list[dict]:
    """``helm install`` (or ``upgrade``) the chart into ``namespace``; the release's objects."""
    helm(command, RELEASE, str(CHART), "--namespace", namespace, *values_args(values), kubeconfig=kube.kubeconfig)
    manifest = helm("get", "manifest", RELEASE, "--namespace", namespace, kubeconfig=kube.kubeconfig).stdout
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def identity(obj: dict) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def test_helm_install_creates_every_object(kube, namespace):
    jobs_namespace = f"{namespace}-jobs"
    kube.kubectl("create", "namespace", jobs_namespace)
    values = {"watchNamespaces": [jobs_namespace], "networkPolicy": {"enabled": True},
              "database": {"secretName": "embedjob-operator-db"}}
    objects = install(kube, namespace, values)
    expected = {identity(o) for o in objects}
    assert {kind for kind, _, _ in expected} == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment",
        "NetworkPolicy", "ConfigMap", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    found = json.loads(kube.kubectl("get", "-f", "-", "-o", "json", input=yaml.safe_dump_all(objects)).stdout)
    assert {identity(o) for o in found["items"]} == expected
    kube.kubectl("get", "crd", "embeddingjobs.embedjob.dev")
    status = json.loads(helm("status", RELEASE, "--namespace", namespace, "-o", "json",
                             kubeconfig=kube.kubeconfig).stdout)
    assert status["info"]["status"] == "deployed"
    assert "kubectl wait --for=condition=Complete ej/quickstart" in status["info"]["notes"]


def test_helm_install_refuses_invalid_values(kube, namespace):
    res = helm("install", RELEASE, str(CHART), "--namespace", namespace, "--set", "replicaCount=2",
               check=False, kubeconfig=kube.kubeconfig)
    assert_refused(res, "at '/replicaCount': value must be 1")
    releases = helm("list", "--namespace", namespace, "-q", kubeconfig=kube.kubeconfig).stdout.split()
    assert releases == []


@dataclass(frozen=True)
class Access:
    """One ``kubectl auth can-i`` question."""

    verb: str
    group: str
    resource: str  #: may carry a subresource: embeddingjobs/status

    def can_i(self, kube, kubeconfig: str, namespace: str | None) -> bool:
        """Asked as the identity of ``kubeconfig``; in ``namespace``, or cluster-wide when None."""
        resource, _, subresource = self.resource.partition("/")
        args = ["auth", "can-i", self.verb, f"{resource}.{self.group}" if self.group else resource]
        if subresource:
            args.append(f"--subresource={subresource}")
        args += ["--namespace", namespace] if namespace else ["--all-namespaces"]
        res = kube.kubectl(*args, check=False, kubeconfig=kubeconfig)
        assert res.stdout.strip() in ("yes", "no"), f"kubectl {' '.join(args)}: {res.stdout}{res.stderr}"
        return res.stdout.strip() == "yes"


def accesses(rules) -> set[Access]:
    return {Access(verb, group, resource)
            for rule in rules for group in rule.api_groups for resource in rule.resources for verb in rule.verbs}


#: what the operator must never be able to do (those it needs are taken out below)
FORBIDDEN_SAMPLE = {
    Access("list", "", "secrets"), Access("watch", "", "secrets"), Access("update", "", "secrets"),
    Access("create", "", "secrets"), Access("delete", "", "secrets"),
    Access("create", "", "pods"), Access("create", "", "pods/exec"), Access("create", "", "configmaps"),
    Access("create", "", "serviceaccounts/token"),
    Access("create", "rbac.authorization.k8s.io", "rolebindings"),
    Access("create", "embedjob.dev", "embeddingjobs"), Access("delete", "embedjob.dev", "embeddingjobs"),
    Access("deletecollection", "embedjob.dev", "embeddingjobs"),
    Access("deletecollection", "ray.io", "rayjobs"), Access("create", "ray.io", "rayclusters"),
}
FORBIDDEN_CLUSTER_SAMPLE = {
    Access("create", "rbac.authorization.k8s.io", "clusterroles"),
    Access("create", "rbac.authorization.k8s.io", "clusterrolebindings"),
    Access("delete", "", "nodes"), Access("create", "", "namespaces"), Access("delete", "", "namespaces"),
    Access("create", "apiextensions.k8s.io", "customresourcedefinitions"),
    Access("update", "apiextensions.k8s.io", "customresourcedefinitions"),
    Access("list", "", "secrets"),
}


def assert_access(kube, kubeconfig: str, expected: dict[tuple[Access, str | None], bool]) -> None:
    """Every (access, namespace) is allowed exactly when expected (all answers, then one assert)."""
    wrong = {f"{a.verb} {a.resource}.{a.group} in {ns or 'all namespaces'}: expected {'yes' if want else 'no'}"
             for (a, ns), want in expected.items() if a.can_i(kube, kubeconfig, ns) != want}
    assert not wrong, sorted(wrong)


@pytest.fixture
def jobs_namespaces(kube, namespace):
    """Two more namespaces next to ``namespace`` (the release's): a watched one and another."""
    names = [f"{namespace}-jobs", f"{namespace}-other"]
    for name in names:
        kube.kubectl("create", "namespace", name)
    yield names
    for name in names:
        kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def chart_serviceaccount_kubeconfig(kube, namespace: str, objects: list[dict]) -> str:
    return kube.kubeconfig_for_serviceaccount(namespace, the(objects, "ServiceAccount")["metadata"]["name"])


def test_cluster_wide_serviceaccount_can_do_what_the_operator_needs_and_no_more(kube, namespace, jobs_namespaces):
    from controller import permissions

    jobs_namespace, _ = jobs_namespaces
    kubeconfig = chart_serviceaccount_kubeconfig(kube, namespace, install(kube, namespace))
    try:
        namespaced, cluster = accesses(permissions.NAMESPACED_RULES), accesses(permissions.CLUSTER_RULES)
        expected = {(a, jobs_namespace): True for a in namespaced}
        expected |= {(a, None): True for a in namespaced | cluster}
        expected |= {(a, jobs_namespace): False for a in FORBIDDEN_SAMPLE - namespaced}
        expected |= {(a, None): False for a in FORBIDDEN_CLUSTER_SAMPLE - namespaced - cluster}
        assert_access(kube, kubeconfig, expected)
    finally:
        # A cluster-wide release's pod policy binds every namespace, and denies every job once its params
        # ConfigMap goes with this namespace: the later tests of the session must not inherit it.
        helm("uninstall", RELEASE, "--namespace", namespace, "--no-hooks", kubeconfig=kube.kubeconfig)


def test_namespaced_serviceaccount_can_do_what_the_operator_needs_in_watched_namespaces_only(
        kube, namespace, jobs_namespaces):
    from controller import permissions

    watched, other = jobs_namespaces
    objects = install(kube, namespace, {"watchNamespaces": [watched]})
    kubeconfig = chart_serviceaccount_kubeconfig(kube, namespace, objects)
    namespaced = accesses(permissions.NAMESPACED_RULES)
    cluster = accesses(permissions.cluster_rules(clusterwide=False))
    # what releasing the jobs needs outlives a watched namespace's RoleBinding: its deletion completes (issue 26 item 4)
    released = accesses(permissions.NAMESPACE_DELETION)
    expected = {(a, watched): True for a in namespaced}
    expected |= {(a, None): True for a in cluster}
    expected |= {(a, other): a in released for a in namespaced}
    expected |= {(a, None): a in released for a in namespaced}
    expected |= {(a, watched): False for a in FORBIDDEN_SAMPLE - namespaced}
    expected |= {(a, None): False for a in FORBIDDEN_CLUSTER_SAMPLE - cluster}
    assert_access(kube, kubeconfig, expected)


def start_operator_as_the_chart_runs_it(kube, namespace: str, objects: list[dict], log_path: Path) -> OperatorProcess:
    """``python -m controller`` with the chart's Deployment environment and the token of the
    chart's ServiceAccount (its only rights); free local ports instead of the pod's 8080/9090."""
    rendered = container_env(objects)
    assert all("value" in e for e in rendered.values()), "values from Secrets are not resolved here"
    health_port, metrics_port = free_port(), free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith("EMBEDJOB_")}
    env |= {name: e["value"] for name, e in rendered.items()} | {
        "KUBECONFIG": chart_serviceaccount_kubeconfig(kube, namespace, objects),
        "EMBEDJOB_HEALTH_PORT": str(health_port),
        "EMBEDJOB_METRICS_PORT": str(metrics_port),
    }
    operator = OperatorProcess(env=env, log_path=log_path, health_port=health_port, metrics_port=metrics_port)
    return operator.start()


def test_operator_runs_as_the_chart_configures_it(kube, namespace, jobs_namespaces, kuberay_operator, tmp_path):
    """As the chart runs it: a job gets its RayJob, KubeRay takes it, the job is Accepted."""
    jobs_namespace, _ = jobs_namespaces
    objects = install(kube, namespace, {"watchNamespaces": [jobs_namespace]})
    operator = start_operator_as_the_chart_runs_it(kube, namespace, objects, tmp_path / "operator.log")
    try:
        create_database_secret(kube, jobs_namespace, "postgresql://writer:secret@db.example:5432/embed")
        apply_job(kube, jobs_namespace, "quickstart")
        job = wait_for_condition(kube, jobs_namespace, "quickstart", "Accepted", timeout=60)
        (rayjob,) = rayjobs(kube, jobs_namespace)
        assert rayjob["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        cluster = rayjob["spec"]["rayClusterSpec"]
        chart_env = container_env(objects)
        assert cluster["rayVersion"] == chart_env["EMBEDJOB_RAY_VERSION"]["value"]
        head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
        assert head["image"] == chart_env["EMBEDJOB_WORKER_IMAGE"]["value"]
        status = wait_until("KubeRay to start the RayJob's RayCluster", lambda: get_json(
            kube, "rayjob", rayjob["metadata"]["name"], "-n", jobs_namespace).get("status", {}).get("rayClusterName"))
        assert status
        assert "forbidden" not in operator.log().lower(), operator.log()[-3000:]
    finally:
        operator.stop()


@pytest.mark.slow
def test_job_completes_with_the_operator_as_the_chart_runs_it(
        kube_without_kuberay, standin_namespace, local_ray, database_url, tmp_path):
    """End to end under the chart's identity and configuration, proof that its RBAC is
    enough: the test stand-in for KubeRay + kubelet runs the RayJob's entrypoint on a
    local Ray; the job reaches Complete and every record has its vector."""
    kube, jobs_namespace = kube_without_kuberay, standin_namespace
    release_namespace = f"{jobs_namespace}-operator"
    kube.kubectl("create", "namespace", release_namespace)
    objects = install(kube, release_namespace, {"watchNamespaces": [jobs_namespace]})
    operator = start_operator_as_the_chart_runs_it(kube, release_namespace, objects, tmp_path / "operator.log")
    records = SAMPLE.read_text().splitlines()[:48]
    source = tmp_path / "pep-48.jsonl"
    source.write_text("\n".join(records) + "\n")
    try:
        create_database_secret(kube, jobs_namespace, database_url)
        with RayJobRunner(kube, jobs_namespace, local_ray, tmp_path, {}) as runner:
            apply_job(kube, jobs_namespace, "quickstart", source={"uri": str(source)}, batching={"batchSize": 16})
            waited = kube.kubectl("wait", "--for=condition=Complete", "ej/quickstart", "-n", jobs_namespace,
                                  "--timeout=300s", check=False, timeout=330)
            assert waited.returncode == 0, (waited.stderr, operator.log()[-3000:])
        assert runner.errors == []
        ids = sorted(json.loads(line)["id"] for line in records)
        assert sorted(r.record_id for r in query(database_url, "SELECT record_id FROM embeddings")) == ids
        assert "forbidden" not in operator.log().lower(), operator.log()[-3000:]
    finally:
        operator.stop()


def test_uninstall_releases_the_jobs_so_deleting_them_completes(kube, namespace, jobs_namespaces, kuberay_operator,
                                                                tmp_path):
    """`helm uninstall` runs the chart's pre-delete hook, which takes the operator's finalizer off
    every job; deleting a job afterwards completes although no operator runs any more. The hook's
    container runs here as a process (no kubelet), with its environment and its ServiceAccount."""
    jobs_namespace, _ = jobs_namespaces
    objects = install(kube, namespace, {"watchNamespaces": [jobs_namespace]})
    operator = start_operator_as_the_chart_runs_it(kube, namespace, objects, tmp_path / "operator.log")
    create_database_secret(kube, jobs_namespace, "postgresql://writer:secret@db.example:5432/embed")
    apply_job(kube, jobs_namespace, "quickstart")
    job = wait_for_condition(kube, jobs_namespace, "quickstart", "Accepted", timeout=60)
    assert job["metadata"]["finalizers"] == ["embedjob.dev/cleanup"]

    hooks = [doc for doc in yaml.safe_load_all(helm("get", "hooks", RELEASE, "--namespace", namespace,
                                                    kubeconfig=kube.kubeconfig).stdout) if doc]
    hook = the(hooks, "Job")
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    pod = hook["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][:1] == ["python"] and container["image"] == the(
        objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    env = {name: value for name, value in os.environ.items() if not name.startswith("EMBEDJOB_")}
    env |= {e["name"]: e["value"] for e in container["env"]}
    env["KUBECONFIG"] = kube.kubeconfig_for_serviceaccount(namespace, pod["serviceAccountName"])
    hook_run = subprocess.run([sys.executable, *container["command"][1:]], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=60)
    assert hook_run.returncode == 0, hook_run.stderr
    assert f"released {jobs_namespace}/quickstart" in hook_run.stdout

    # The operator, still running, leaves the released job alone: it does not put the finalizer back.
    kube.kubectl("annotate", "ej", "quickstart", "-n", jobs_namespace, "example.com/touched=1")
    for _ in range(6):
        released = get_json(kube, "ej", "quickstart", "-n", jobs_namespace)["metadata"]
        assert "finalizers" not in released and released["annotations"]["embedjob.dev/released"] == "true"
        time.sleep(0.5)

    # What the hook Job stood in for is done: uninstall (no kubelet runs the hook here), the operator goes.
    helm("uninstall", RELEASE, "--namespace", namespace, "--no-hooks", kubeconfig=kube.kubeconfig)
    operator.stop()
    started = time.monotonic()
    kube.kubectl("delete", "ej", "quickstart", "-n", jobs_namespace, "--timeout=30s")
    assert time.monotonic() - started < 30
    assert kube.kubectl("get", "ej", "quickstart", "-n", jobs_namespace, check=False).returncode != 0
