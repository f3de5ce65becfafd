"""The Helm chart (charts/embedjob-operator) with the real helm, and installed into
the real API server of tests/envtest: schema, rendered objects, RBAC = what the
operator calls (controller/permissions.py), and what the ServiceAccount may do."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from plugins.operator_process import OperatorProcess
from plugins.standin import RayJobRunner
from support.chart import (
    RELEASE,
    RELEASE_NAMESPACE,
    assert_refused,
    by_kind,
    container_env,
    helm,
    render_chart,
    the,
    values_args,
)
from support.kubectl import apply_job, create_database_secret, get_json, rayjobs, wait_for_condition
from support.manifests import quickstart_rayjob
from support.net import free_port
from support.paths import CHART, REPO
from support.polling import wait_until
from support.project import pinned_ray_version, pyproject
from support.sql import query

#: values that switch on every optional part (helm template only: no ServiceMonitor CRD in envtest)
NON_DEFAULT_VALUES = {
    "watchNamespaces": ["team-a", "team-b"],
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "networkPolicy": {"enabled": True, "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]},
    "database": {"secretName": "embedjob-operator-db", "secretKey": "dsn"},
    "image": {"repository": "registry.example.com/embedjob-controller", "tag": "9.9.9", "pullPolicy": "Always"},
    "worker": {"image": {"repository": "registry.example.com/embedjob-worker", "tag": "9.9.9-gpu"}, "rayVersion": "2.60.0"},
    "imagePullSecrets": [{"name": "regcred"}],
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
    "extraEnv": [{"name": "EMBEDJOB_EXTRA", "value": "1"}],
    "logFormat": "plain",
}


# ------------------------------------------------------------ chart contents


def test_chart_crds_are_the_repo_crds():
    repo_crds = {p.name: p.read_bytes() for p in (REPO / "crds").glob("*.yaml")}
    chart_crds = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert repo_crds, "no CRDs under crds/"
    assert chart_crds == repo_crds, "charts/embedjob-operator/crds/ is stale: cp crds/*.yaml charts/embedjob-operator/crds/"


def test_chart_versions_follow_the_project():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["appVersion"] == pyproject()["project"]["version"]
    assert values["worker"]["rayVersion"] == pinned_ray_version()


@pytest.mark.parametrize("values", [None, NON_DEFAULT_VALUES], ids=["default", "non-default"])
def test_helm_lint(values):
    res = helm("lint", "--strict", str(CHART), *values_args(values))
    assert "1 chart(s) linted, 0 chart(s) failed" in res.stdout


def test_default_render():
    objects = render_chart()
    assert sorted(o["kind"] for o in objects) == sorted(
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment"])
    deployment = the(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"ghcr.io/embedjob/embedjob-controller:{pyproject()['project']['version']}"
    env = container_env(objects)
    assert env["EMBEDJOB_WATCH_NAMESPACES"]["value"] == ""
    assert env["EMBEDJOB_WORKER_IMAGE"]["value"] == f"ghcr.io/embedjob/embedjob-worker:{pyproject()['project']['version']}"
    assert env["EMBEDJOB_RAY_VERSION"]["value"] == pinned_ray_version()
    assert env["EMBEDJOB_HEALTH_PORT"]["value"] == "8080"
    assert env["EMBEDJOB_METRICS_PORT"]["value"] == "9090"
    assert "EMBEDJOB_DATABASE_URL" not in env
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert ports == {"health": 8080, "metrics": 9090}
    assert pod["serviceAccountName"] == the(objects, "ServiceAccount")["metadata"]["name"]
    service = the(objects, "Service")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (subject,) = the(objects, "ClusterRoleBinding")["subjects"]
    assert subject == {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": RELEASE_NAMESPACE}


def test_operator_pod_is_locked_down():
    pod = the(render_chart(), "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["resources"]["requests"] and container["resources"]["limits"]
    # the one writable place: /tmp on an emptyDir
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == "/tmp"
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume


def test_non_default_render():
    objects = render_chart(NON_DEFAULT_VALUES)
    env = container_env(objects)
    assert env["EMBEDJOB_WATCH_NAMESPACES"]["value"] == "team-a,team-b"
    assert env["EMBEDJOB_DATABASE_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "embedjob-operator-db", "key": "dsn"}}
    assert env["EMBEDJOB_WORKER_IMAGE"]["value"] == "registry.example.com/embedjob-worker:9.9.9-gpu"
    assert env["EMBEDJOB_LOG_FORMAT"]["value"] == "plain"
    assert env["EMBEDJOB_EXTRA"] == {"name": "EMBEDJOB_EXTRA", "value": "1"}
    pod = the(objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (container["image"], container["imagePullPolicy"]) == (
        "registry.example.com/embedjob-controller:9.9.9", "Always")
    for key in ("imagePullSecrets", "nodeSelector", "tolerations", "affinity"):
        assert pod[key] == NON_DEFAULT_VALUES[key]

    # namespaced RBAC: a Role + RoleBinding in each watched namespace
    roles = {r["metadata"]["namespace"]: r for r in by_kind(objects, "Role")}
    bindings = {b["metadata"]["namespace"]: b for b in by_kind(objects, "RoleBinding")}
    assert set(roles) == set(bindings) == {"team-a", "team-b"}
    for namespace, binding in bindings.items():
        assert binding["roleRef"]["name"] == roles[namespace]["metadata"]["name"]
        assert binding["subjects"][0]["namespace"] == RELEASE_NAMESPACE

    monitor = the(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= the(objects, "Service")["metadata"]["labels"].items()

    policy = the(objects, "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    metrics_ingress = [rule for rule in policy["ingress"] if rule["ports"][0]["port"] == "metrics"]
    assert metrics_ingress[0]["from"] == NON_DEFAULT_VALUES["networkPolicy"]["metricsFrom"]
    egress_ports = {port["port"] for rule in policy["egress"] for port in rule["ports"]}
    assert egress_ports == {53, 443, 6443, 5432}


class RecordingEnv(dict):
    """An environment that records which variables were read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


@pytest.mark.parametrize("values", [None, NON_DEFAULT_VALUES], ids=["default", "non-default"])
def test_operator_settings_accept_the_environment_the_chart_sets(values):
    from controller.settings import Settings

    rendered = container_env(render_chart(values))
    secret_url = "postgresql://reader@db.example/embeddings"
    env = RecordingEnv({name: e.get("value", secret_url) for name, e in rendered.items()})
    settings = Settings.from_env(env)
    chart_variables = {name for name in env if name != "EMBEDJOB_EXTRA"}
    assert chart_variables <= env.read, f"set by the chart, never read: {sorted(chart_variables - env.read)}"
    values = values or {}
    assert settings.watch_namespaces == tuple(values.get("watchNamespaces", ()))
    assert settings.ray_version == pinned_ray_version()
    assert (settings.health_port, settings.metrics_port) == (8080, 9090)
    assert settings.database_url == (secret_url if "database" in values else None)
    assert settings.worker_image == rendered["EMBEDJOB_WORKER_IMAGE"]["value"]


def test_rayjobs_run_the_chart_worker_image_with_its_ray_version():
    env = {name: e["value"] for name, e in container_env(render_chart(NON_DEFAULT_VALUES)).items() if "value" in e}
    cluster = quickstart_rayjob(env)["spec"]["rayClusterSpec"]
    assert cluster["rayVersion"] == pinned_ray_version()
    pods = [cluster["headGroupSpec"]["template"]] + [group["template"] for group in cluster["workerGroupSpecs"]]
    images = {container["image"] for pod in pods for container in pod["spec"]["containers"]}
    assert images == {"registry.example.com/embedjob-worker:9.9.9-gpu"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": 2}, "at '/replicaCount': value must be 1"),
        ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'"),
        ({"metricsPort": "9090"}, "at '/metricsPort': got string, want integer"),
        ({"healthPort": 70000}, "at '/healthPort'"),
        ({"watchNamespaces": "team-a"}, "at '/watchNamespaces': got string, want array"),
        ({"watchNamespaces": ["Team_A"]}, "at '/watchNamespaces/0'"),
        ({"serviceMonitor": {"enabled": "yes"}}, "at '/serviceMonitor/enabled': got string, want boolean"),
        ({"worker": {"rayVersion": "latest"}}, "at '/worker/rayVersion'"),
        ({"logFormat": "xml"}, "at '/logFormat'"),
        ({"replicas": 1}, "additional properties 'replicas' not allowed"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_invalid_values_are_refused_by_the_schema(values, message):
    assert_refused(helm("template", RELEASE, str(CHART), *values_args(values), check=False), message)


# ---------------------------------------------------------------------- RBAC

RBAC_RULES_FILE = CHART / "files" / "rbac-rules.json"


def test_rbac_rules_file_is_the_operators_permissions():
    from controller import permissions

    assert json.loads(RBAC_RULES_FILE.read_text()) == permissions.as_document(), (
        "charts/embedjob-operator/files/rbac-rules.json is stale: "
        "python -m controller.permissions > charts/embedjob-operator/files/rbac-rules.json")


@pytest.mark.parametrize("watch_namespaces", [[], ["team-a", "team-b"]], ids=["cluster-wide", "namespaced"])
def test_rendered_rbac_rules_are_the_operators_permissions(watch_namespaces):
    from controller import permissions

    objects = render_chart({"watchNamespaces": watch_namespaces})
    clusterwide = not watch_namespaces
    assert the(objects, "ClusterRole")["rules"] == permissions.policy_rules(permissions.cluster_rules(clusterwide))
    roles = by_kind(objects, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(watch_namespaces)
    for role in roles:
        assert role["rules"] == permissions.policy_rules(permissions.NAMESPACED_RULES)
    for rule in [rule for o in objects if o["kind"] in ("ClusterRole", "Role") for rule in o["rules"]]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no nonResourceURLs, no resourceNames tricks
        assert not any("*" in item for key in rule for item in rule[key]), rule


def test_rbac_can_be_left_to_an_administrator():
    kinds = {o["kind"] for o in render_chart({"rbac": {"create": False}, "watchNamespaces": ["team-a"]})}
    assert kinds.isdisjoint({"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"})
    assert "ServiceAccount" in kinds


# ----------------------------------------------------- installed into envtest


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
        "NetworkPolicy"}
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
    namespaced, cluster = accesses(permissions.NAMESPACED_RULES), accesses(permissions.CLUSTER_RULES)
    expected = {(a, jobs_namespace): True for a in namespaced}
    expected |= {(a, None): True for a in namespaced | cluster}
    expected |= {(a, jobs_namespace): False for a in FORBIDDEN_SAMPLE - namespaced}
    expected |= {(a, None): False for a in FORBIDDEN_CLUSTER_SAMPLE - namespaced - cluster}
    assert_access(kube, kubeconfig, expected)


def test_namespaced_serviceaccount_can_do_what_the_operator_needs_in_watched_namespaces_only(
        kube, namespace, jobs_namespaces):
    from controller import permissions

    watched, other = jobs_namespaces
    objects = install(kube, namespace, {"watchNamespaces": [watched]})
    kubeconfig = chart_serviceaccount_kubeconfig(kube, namespace, objects)
    namespaced = accesses(permissions.NAMESPACED_RULES)
    cluster = accesses(permissions.cluster_rules(clusterwide=False))
    expected = {(a, watched): True for a in namespaced}
    expected |= {(a, None): True for a in cluster}
    expected |= {(a, other): False for a in namespaced}
    expected |= {(a, None): False for a in namespaced}
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
    records = (REPO / "examples" / "pep-sample.jsonl").read_text().splitlines()[:48]
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
