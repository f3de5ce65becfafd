"""Self-tests of the envtest harness (tests/envtest): the control plane behaves
like a real Kubernetes API server, and the real KubeRay operator reconciles."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from envtest.control_plane import KubectlError
from support.kubectl import get_json

pytestmark = pytest.mark.k8s

GROUP = "envtest.embedjob.dev"

WIDGET_CRD = f"""
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.{GROUP}
spec:
  group: {GROUP}
  scope: Namespaced
  names: {{plural: widgets, singular: widget, kind: Widget, shortNames: [wdg]}}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {{status: {{}}}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {{type: integer, minimum: 1}}
              color: {{type: string, enum: [red, blue]}}
          status:
            type: object
            properties:
              conditions:
                type: array
                items:
                  type: object
                  required: [type, status]
                  properties:
                    type: {{type: string}}
                    status: {{type: string}}
                    reason: {{type: string}}
                    message: {{type: string}}
                    lastTransitionTime: {{type: string, format: date-time}}
"""


def widget(name: str, **spec) -> str:
    return json.dumps({"apiVersion": f"{GROUP}/v1", "kind": "Widget",
                       "metadata": {"name": name}, "spec": spec})


@pytest.fixture(scope="module")
def widget_crd(kube):
    kube.apply(WIDGET_CRD)
    kube.kubectl("wait", "--for=condition=Established", f"crd/widgets.{GROUP}", "--timeout=60s")
    return f"widgets.{GROUP}"


def test_control_plane_basics(kube):
    assert kube.server.startswith("https://127.0.0.1:")
    version = json.loads(kube.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert version["gitVersion"] == kube.versions["KUBERNETES_VERSION"]
    # KubeRay's CRDs are installed and served
    crds = kube.kubectl("get", "crd", "-o", "name").stdout.split()
    for name in ("rayjobs.ray.io", "rayclusters.ray.io", "rayservices.ray.io"):
        assert f"customresourcedefinition.apiextensions.k8s.io/{name}" in crds
    assert "rayjobs" in kube.kubectl("api-resources", "--api-group=ray.io", "-o", "name").stdout


def test_apply_crd_and_object(kube, widget_crd, namespace):
    out = kube.kubectl("apply", "-n", namespace, "-f", "-", input=widget("w1", size=3, color="red")).stdout
    assert "widget.envtest.embedjob.dev/w1 created" in out
    got = json.loads(kube.kubectl("get", "wdg", "w1", "-n", namespace, "-o", "json").stdout)
    assert got["spec"] == {"size": 3, "color": "red"}
    assert got["metadata"]["namespace"] == namespace
    assert got["metadata"]["generation"] == 1


def test_in_process_reads_give_what_kubectl_get_prints(kube, widget_crd, namespace):
    """support.kubectl.get_json reads in this process (envtest.api_reads): the same objects and lists as
    `kubectl get -o json`, by plural, singular, short name and name.group; a missing one fails as kubectl's does."""
    for name, size in (("r1", 1), ("r2", 2)):
        labelled = json.loads(widget(name, size=size))
        labelled["metadata"]["labels"] = {"size": str(size)}
        kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(labelled))
    for args in (("wdg", "r1"), ("widget", "r1"), (widget_crd, "r2"), ("widgets",), ("widgets", "-l", "size=2"),
                 ("serviceaccount", "default"), ("configmaps",)):
        by_kubectl = json.loads(kube.kubectl("get", *args, "-n", namespace, "-o", "json").stdout)
        read = get_json(kube, *args, "-n", namespace)
        if "items" in by_kubectl:
            assert [(i["apiVersion"], i["kind"], i["metadata"]["name"]) for i in read["items"]] == [
                (i["apiVersion"], i["kind"], i["metadata"]["name"]) for i in by_kubectl["items"]], args
            assert all(i.get("spec") == j.get("spec") for i, j in zip(read["items"], by_kubectl["items"]))
        else:
            assert read == by_kubectl, args
    assert [i["metadata"]["name"] for i in get_json(kube, "widgets", "-n", namespace, "-l", "size=2")["items"]] == ["r2"]
    assert get_json(kube, "namespace", namespace)["metadata"]["name"] == namespace  # a cluster-scoped one
    with pytest.raises(KubectlError, match="NotFound"):
        get_json(kube, "wdg", "absent", "-n", namespace)
    with pytest.raises(KubectlError, match="doesn't have a resource type"):
        get_json(kube, "gadgets", "-n", namespace)


def test_schema_violation_names_the_field(kube, widget_crd, namespace):
    res = kube.kubectl("apply", "-n", namespace, "-f", "-", input=widget("bad", size=0, color="green"), check=False)
    assert res.returncode != 0
    assert "spec.size" in res.stderr and "should be greater than or equal to 1" in res.stderr
    assert "spec.color" in res.stderr and 'Unsupported value: "green"' in res.stderr

    res = kube.kubectl("apply", "-n", namespace, "-f", "-", input=widget("bad", color="red"), check=False)
    assert res.returncode != 0
    assert "spec.size: Required value" in res.stderr
    # nothing was stored
    assert kube.kubectl("get", "wdg", "bad", "-n", namespace, check=False).returncode != 0


def test_wait_for_condition_on_status_subresource(kube, widget_crd, namespace):
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=widget("w2", size=1))

    # not Ready yet: kubectl wait times out
    res = kube.kubectl("wait", "--for=condition=Ready", "wdg/w2", "-n", namespace, "--timeout=2s", check=False)
    assert res.returncode != 0
    assert "timed out" in res.stderr

    ready = {"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "Testing", "message": "patched by the test",
        "lastTransitionTime": "2024-01-01T00:00:00Z"}]}}
    # status is a subresource: a patch of the main resource does not change it
    kube.kubectl("patch", "wdg", "w2", "-n", namespace, "--type=merge", "-p", json.dumps(ready))
    got = json.loads(kube.kubectl("get", "wdg", "w2", "-n", namespace, "-o", "json").stdout)
    assert "status" not in got or not got["status"].get("conditions")

    # a waiter started before the condition is set returns once it is set
    waiter = subprocess.Popen(
        [kube.bin.kubectl, f"--kubeconfig={kube.kubeconfig}", "wait", "--for=condition=Ready", "wdg/w2",
         "-n", namespace, "--timeout=60s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1)
        assert waiter.poll() is None, waiter.communicate()
        kube.kubectl("patch", "wdg", "w2", "-n", namespace, "--subresource=status", "--type=merge",
                     "-p", json.dumps(ready))
        out, err = waiter.communicate(timeout=60)
    finally:
        if waiter.poll() is None:
            waiter.kill()
    assert waiter.returncode == 0, err
    assert "widget.envtest.embedjob.dev/w2 condition met" in out
    got = json.loads(kube.kubectl("get", "wdg", "w2", "-n", namespace, "-o", "json").stdout)
    assert got["status"]["conditions"][0]["reason"] == "Testing"
    assert got["metadata"]["generation"] == 1  # status writes do not bump generation


def can_i(kube, kubeconfig, verb, resource, namespace) -> str:
    res = kube.kubectl("auth", "can-i", verb, resource, "-n", namespace, kubeconfig=kubeconfig, check=False)
    assert res.returncode in (0, 1), res.stderr
    return res.stdout.strip()


def test_auth_can_i_per_identity(kube, namespace):
    kube.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    kube.kubectl("create", "role", "cm-get", "--verb=get", "--resource=configmaps", "-n", namespace)
    kube.kubectl("create", "rolebinding", "reader-cm-get", "--role=cm-get",
                 f"--serviceaccount={namespace}:reader", "-n", namespace)
    kube.kubectl("create", "role", "cm-list", "--verb=list", "--resource=configmaps", "-n", namespace)
    kube.kubectl("create", "rolebinding", "viewers-cm-list", "--role=cm-list", "--group=embedjob-viewers",
                 "-n", namespace)
    kube.kubectl("create", "configmap", "c1", "--from-literal=k=v", "-n", namespace)

    sa = kube.kubeconfig_for_serviceaccount(namespace, "reader")
    who = json.loads(kube.kubectl("auth", "whoami", "-o", "json", kubeconfig=sa).stdout)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:reader"
    assert can_i(kube, sa, "get", "configmaps", namespace) == "yes"
    assert can_i(kube, sa, "delete", "configmaps", namespace) == "no"
    assert can_i(kube, sa, "get", "configmaps", "default") == "no"  # a Role is namespaced
    # the real requests agree with can-i
    assert kube.kubectl("get", "configmap", "c1", "-n", namespace, "-o", "jsonpath={.data.k}",
                        kubeconfig=sa).stdout == "v"
    denied = kube.kubectl("delete", "configmap", "c1", "-n", namespace, kubeconfig=sa, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr

    alice = kube.kubeconfig_for_user("alice", groups=["embedjob-viewers"])
    bob = kube.kubeconfig_for_user("bob")
    assert can_i(kube, alice, "list", "configmaps", namespace) == "yes"
    assert can_i(kube, alice, "get", "configmaps", namespace) == "no"
    assert can_i(kube, bob, "list", "configmaps", namespace) == "no"
    who = json.loads(kube.kubectl("auth", "whoami", "-o", "json", kubeconfig=alice).stdout)
    assert who["status"]["userInfo"]["username"] == "alice"
    assert "embedjob-viewers" in who["status"]["userInfo"]["groups"]
    # the admin kubeconfig may do anything
    assert can_i(kube, kube.kubeconfig, "*", "*", namespace) == "yes"


RAYJOB = """
apiVersion: ray.io/v1
kind: RayJob
metadata:
  name: hello
spec:
  entrypoint: python -c "print('hello')"
  shutdownAfterJobFinishes: true
  rayClusterSpec:
    headGroupSpec:
      rayStartParams: {}
      template:
        spec:
          containers:
          - name: ray-head
            image: rayproject/ray:2.46.0
            resources:
              limits: {cpu: "1", memory: 2Gi}
"""


def test_kuberay_operator_creates_raycluster_for_rayjob(kube, kuberay_operator, namespace):
    kube.apply(RAYJOB, namespace=namespace)
    rayjob = json.loads(kube.kubectl("get", "rayjob", "hello", "-n", namespace, "-o", "json").stdout)

    deadline = time.monotonic() + 90
    clusters = []
    while time.monotonic() < deadline:
        clusters = json.loads(kube.kubectl("get", "rayclusters", "-n", namespace, "-o", "json").stdout)["items"]
        if clusters:
            break
        time.sleep(0.5)
    assert clusters, f"no RayCluster after 90s; operator log:\n{kuberay_operator.log_tail()}"
    assert len(clusters) == 1
    owners = clusters[0]["metadata"].get("ownerReferences", [])
    assert [(o["kind"], o["name"], o["uid"], o.get("controller")) for o in owners] == \
        [("RayJob", "hello", rayjob["metadata"]["uid"], True)]
    assert clusters[0]["metadata"]["name"].startswith("hello-")

    # the operator records the cluster in the RayJob's status
    deadline = time.monotonic() + 60
    status = {}
    while time.monotonic() < deadline:
        status = json.loads(kube.kubectl("get", "rayjob", "hello", "-n", namespace, "-o", "json").stdout).get(
            "status", {})
        if status.get("rayClusterName"):
            break
        time.sleep(0.5)
    assert status.get("rayClusterName") == clusters[0]["metadata"]["name"]
    assert status.get("jobDeploymentStatus") == "Initializing"  # no kubelet: the head pod never runs
