"""The Helm chart (charts/embedjob-operator) rendered by the real helm: lint, schema,
rendered objects, RBAC = what the operator calls (controller/permissions.py), and the
controller image's user = the chart's securityContext."""

from __future__ import annotations

import json

import pytest

from controller.rayjob import LABEL_JOB_NAME
from controller.rayjob import labels as rayjob_labels
from embedjob.contract import DRIVER_METRICS_PORT_NAME
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
from support.dockerfiles import CONTROLLER_DOCKERFILE, final_user, parse_dockerfile
from support.manifests import quickstart_rayjob
from support.paths import CHART
from support.project import pinned_ray_version, pyproject

#: values that switch on every optional part (helm template only: no ServiceMonitor CRD in envtest)
NON_DEFAULT_VALUES = {
    "watchNamespaces": ["team-a", "team-b"],
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "podMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}, "syncStalledSeconds": 3600},
    "grafanaDashboard": {"enabled": True, "namespace": "monitoring"},
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


@pytest.mark.parametrize("values", [None, NON_DEFAULT_VALUES], ids=["default", "non-default"])
def test_helm_lint(values):
    res = helm("lint", "--strict", str(CHART), *values_args(values))
    assert "1 chart(s) linted, 0 chart(s) failed" in res.stdout


def test_default_render():
    objects = render_chart()
    assert sorted(o["kind"] for o in objects) == sorted(
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment", "ConfigMap",
         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"])
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
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True  # the per-job series' own namespace label

    drivers = the(objects, "PodMonitor")
    assert drivers["metadata"]["labels"]["release"] == "prometheus"
    assert drivers["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    head_labels = {**rayjob_labels({"metadata": {"name": "pep", "uid": "u-1"}}), "ray.io/node-type": "head"}  # KubeRay adds the node type
    assert drivers["spec"]["selector"]["matchLabels"].items() <= head_labels.items()
    (endpoint,) = drivers["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == DRIVER_METRICS_PORT_NAME
    assert endpoint["relabelings"] == [{"sourceLabels": ["__meta_kubernetes_pod_label_embedjob_dev_job_name"],
                                        "targetLabel": "embeddingjob"}]
    assert LABEL_JOB_NAME.replace(".", "_").replace("/", "_").replace("-", "_") == "embedjob_dev_job_name"

    rules = the(objects, "PrometheusRule")
    assert rules["metadata"]["labels"]["release"] == "prometheus"
    alerts = {rule["alert"]: rule for group in rules["spec"]["groups"] for rule in group["rules"]}
    assert sorted(alerts) == ["EmbeddingJobFailed", "EmbeddingJobNoProgress", "EmbeddingScheduleBacklog",
                              "EmbeddingSyncStalled"]
    assert alerts["EmbeddingSyncStalled"]["expr"].endswith("> 3600")

    (dashboard,) = [c for c in by_kind(objects, "ConfigMap") if "embedjob.json" in c.get("data", {})]
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["embedjob.json"])["uid"] == "embedjob"

    policy = the(objects, "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    metrics_ingress = [rule for rule in policy["ingress"] if rule["ports"][0]["port"] == "metrics"]
    assert metrics_ingress[0]["from"] == NON_DEFAULT_VALUES["networkPolicy"]["metricsFrom"]
    egress_ports = {port["port"] for rule in policy["egress"] for port in rule["ports"]}
    assert egress_ports == {53, 443, 6443, 5432, 8265}


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
        ({"prometheusRule": {"syncStalledSeconds": 0}}, "at '/prometheusRule/syncStalledSeconds'"),
        ({"prometheusRule": {"syncStalledSeconds": "1d"}}, "at '/prometheusRule/syncStalledSeconds'"),
        ({"prometheusRule": {"noProgressFor": "30 minutes"}}, "at '/prometheusRule/noProgressFor'"),
        ({"prometheusRule": {"scheduleBacklogFor": "1d"}}, "at '/prometheusRule/scheduleBacklogFor'"),
        ({"prometheusRule": {"severity": "page\n  evil: 1"}}, "at '/prometheusRule/severity'"),
        ({"podMonitor": {"interval": "-1s"}}, "at '/podMonitor/interval'"),
        ({"grafanaDashboard": {"namespace": "Monitoring"}}, "at '/grafanaDashboard/namespace'"),
        ({"grafanaDashboard": {"labels": {"grafana_dashboard": 1}}}, "at '/grafanaDashboard/labels/grafana_dashboard'"),
        ({"worker": {"rayVersion": "latest"}}, "at '/worker/rayVersion'"),
        ({"logFormat": "xml"}, "at '/logFormat'"),
        ({"replicas": 1}, "additional properties 'replicas' not allowed"),
        ({"podPolicy": {"allowHostPath": "yes"}}, "at '/podPolicy/allowHostPath': got string, want boolean"),
        ({"podPolicy": {"allowedImagePrefixes": ["a.example/x,b.example/"]}}, "at '/podPolicy/allowedImagePrefixes/0'"),
        ({"podPolicy": {"allowPrivileged": True}}, "additional properties 'allowPrivileged' not allowed"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_invalid_values_are_refused_by_the_schema(values, message):
    assert_refused(helm("template", RELEASE, str(CHART), *values_args(values), check=False), message)


# ---------------------------------------------------------------- pod policy
def pod_policy_objects(values: dict | None) -> tuple[dict, dict, list[dict], list[dict]]:
    """(the params ConfigMap, the operator's env, the ValidatingAdmissionPolicies, their bindings) rendered."""
    objects = render_chart(values)
    return (the(objects, "ConfigMap"), container_env(objects), by_kind(objects, "ValidatingAdmissionPolicy"),
            by_kind(objects, "ValidatingAdmissionPolicyBinding"))


def test_the_default_pod_policy_is_the_restrictive_one_for_the_admission_policy_and_the_operator():
    from controller.settings import Settings
    from embedjob import pod_policy

    params, env, (policy,), (binding,) = pod_policy_objects(None)
    assert json.loads(env["EMBEDJOB_POD_POLICY"]["value"]) == params["data"]
    assert Settings.from_env({"EMBEDJOB_POD_POLICY": env["EMBEDJOB_POD_POLICY"]["value"]}).pod_policy == \
        pod_policy.PodPolicy(allowed_image_prefixes=("ghcr.io/embedjob/embedjob-worker",))
    assert policy["spec"]["validations"] == pod_policy.admission_validations()
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["paramRef"] == {"name": params["metadata"]["name"], "namespace": RELEASE_NAMESPACE,
                                           "parameterNotFoundAction": "Allow"}
    assert "matchResources" not in binding["spec"]  # cluster-wide, as the operator


def test_the_admin_opens_the_pod_policy_in_the_values():
    from controller.settings import Settings
    from embedjob.pod_policy import PodPolicy

    values = {"watchNamespaces": ["team-a"], "podDefaults": {"workers": {"spec": {"serviceAccountName": "ray-runner"}}},
              "podPolicy": {"allowedImagePrefixes": ["registry.example/ml/"], "allowedServiceAccounts": ["embedder"],
                            "allowHostPath": True}}
    params, env, _, (binding,) = pod_policy_objects(values)
    opened = PodPolicy(("registry.example/ml/",), ("embedder", "ray-runner"), allow_host_path=True)
    assert Settings.from_env({"EMBEDJOB_POD_POLICY": env["EMBEDJOB_POD_POLICY"]["value"]}).pod_policy == opened
    assert json.loads(env["EMBEDJOB_POD_POLICY"]["value"]) == params["data"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}]
    _, _, policies, bindings = pod_policy_objects({"podPolicy": {"admissionPolicy": False}})
    assert policies == bindings == []  # the operator's review alone


# ---------------------------------------------------------------------- RBAC
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


# ---------------------------------------------------------- controller image


def test_controller_image_runs_as_the_non_root_uid_the_chart_sets():
    uid, _, gid = final_user(parse_dockerfile(CONTROLLER_DOCKERFILE)).partition(":")
    assert uid.isdigit() and int(uid) != 0, "USER must be numeric (runAsNonRoot can only check numeric uids)"
    (deployment,) = [o for o in render_chart() if o["kind"] == "Deployment"]
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert (pod_security["runAsUser"], pod_security["runAsGroup"]) == (int(uid), int(gid or uid))
