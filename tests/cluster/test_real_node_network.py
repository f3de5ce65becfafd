"""Pods on the test node that talk to others: Services by DNS name and cluster IP, the API
server with a ServiceAccount token, and a KubeRay RayCluster whose head and worker run Ray.

The real kube-scheduler, kube-controller-manager (EndpointSlice controller) and KubeRay operator
run against the envtest API server; the test node agent runs the pods.
"""

from __future__ import annotations

import json
import time
import urllib.request

from support.node_pods import kubectl_json, phase_in, termination_message


SERVER_SCRIPT = "import http.server, functools; " \
    "h = functools.partial(http.server.SimpleHTTPRequestHandler, directory='/srv'); " \
    "http.server.ThreadingHTTPServer(('0.0.0.0', 8080), h).serve_forever()"

CLIENT_SCRIPT = r"""
import json, os, socket, urllib.request
out = {}
for name in ("web", "web.%(ns)s", "web.%(ns)s.svc", "web.%(ns)s.svc.cluster.local", os.environ["WEB_SERVICE_HOST"]):
    with urllib.request.urlopen(f"http://{name}/index.html", timeout=10) as resp:
        out[name] = resp.read().decode()
out["resolved"] = socket.gethostbyname("web.%(ns)s.svc.cluster.local")
try:
    socket.create_connection((os.environ["EMPTY_SERVICE_HOST"], 80), timeout=5)
    out["empty"] = "connected"
except ConnectionRefusedError:
    out["empty"] = "refused"
open("/dev/termination-log", "w").write(json.dumps(out))
"""


def test_pod_reaches_a_service_by_dns_name_and_cluster_ip(kube, real_node, namespace):
    kube.kubectl("create", "configmap", "site", "-n", namespace, "--from-literal=index.html=served by web")
    server = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": namespace, "labels": {"app": "web"}},
        "spec": {"containers": [{
            "name": "http", "image": "python", "command": ["python", "-c", SERVER_SCRIPT],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/index.html", "port": "http"}, "periodSeconds": 1},
            "livenessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 2},
            "volumeMounts": [{"name": "site", "mountPath": "/srv"}]}],
            "volumes": [{"name": "site", "configMap": {"name": "site"}}]},
    }
    services = [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
                 "spec": {"selector": {"app": app}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}
                for name, app in (("web", "web"), ("empty", "nothing"))]
    kube.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                         "items": [server, *services]}))
    ready = real_node.wait_for_pod(namespace, "web", lambda p: any(
        c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", [])),
        what="Ready")
    # the real EndpointSlice controller publishes the ready pod
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        slices = kubectl_json(kube, "get", "endpointslices", "-n", namespace, "-l", "kubernetes.io/service-name=web")
        addrs = [a for s in slices["items"] for e in s.get("endpoints") or [] for a in e["addresses"]]
        if addrs == [ready["status"]["podIP"]]:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"EndpointSlice of web never listed the pod: {slices}")
    # the API server's service proxy reaches the pod from the host (KubeRay's --use-kubernetes-proxy path)
    proxied = kube.kubectl("get", "--raw", f"/api/v1/namespaces/{namespace}/services/web:http/proxy/index.html")
    assert proxied.stdout == "served by web"
    client = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": namespace},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "get", "image": "python", "command": ["python", "-c", CLIENT_SCRIPT % {"ns": namespace}],
            "terminationMessagePolicy": "FallbackToLogsOnError"}]},
    }
    kube.kubectl("create", "-f", "-", input=json.dumps(client))
    done = real_node.wait_for_pod(namespace, "client", phase_in("Succeeded", "Failed"), what="a final phase")
    assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"], indent=1)
    out = termination_message(done, "get")
    cluster_ip = kubectl_json(kube, "get", "service", "web", "-n", namespace)["spec"]["clusterIP"]
    assert out.pop("resolved") == cluster_ip
    assert out.pop("empty") == "refused"
    assert set(out.values()) == {"served by web"} and len(out) == 5, out


def test_pod_reaches_the_api_server_with_its_serviceaccount_token(kube, real_node, namespace):
    kube.kubectl("create", "rolebinding", "read-pods", "-n", namespace, "--clusterrole=view",
                 f"--serviceaccount={namespace}:default")
    script = r"""
import json, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
ns = open(f"{sa}/namespace").read()
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
req = urllib.request.Request(f"https://kubernetes.default.svc/api/v1/namespaces/{ns}/pods",
                             headers={"Authorization": "Bearer " + open(f"{sa}/token").read()})
items = json.load(urllib.request.urlopen(req, context=ctx, timeout=10))["items"]
open("/dev/termination-log", "w").write(json.dumps(sorted(p["metadata"]["name"] for p in items)))
"""
    kube.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "in-cluster", "namespace": namespace},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "list", "image": "python", "command": ["python", "-c", script],
            "terminationMessagePolicy": "FallbackToLogsOnError"}]}}))
    done = real_node.wait_for_pod(namespace, "in-cluster", phase_in("Succeeded", "Failed"), what="a final phase")
    assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"], indent=1)
    assert termination_message(done, "list") == ["in-cluster"]


RAY_CLUSTER = """
apiVersion: ray.io/v1
kind: RayCluster
metadata:
  name: raycluster
spec:
  rayVersion: "2.60.0"
  headGroupSpec:
    rayStartParams:
      num-cpus: "1"
    template:
      spec:
        containers:
        - name: ray-head
          image: rayproject/ray:2.60.0
          resources:
            requests: {cpu: "1", memory: 2Gi}
            limits: {cpu: "1", memory: 2Gi}
  workerGroupSpecs:
  - groupName: cpu
    replicas: 1
    minReplicas: 1
    maxReplicas: 1
    rayStartParams:
      num-cpus: "1"
    template:
      spec:
        containers:
        - name: ray-worker
          image: rayproject/ray:2.60.0
          resources:
            requests: {cpu: "1", memory: 1Gi}
            limits: {cpu: "1", memory: 1Gi}
"""


def test_kuberay_raycluster_head_and_worker_run_ray_for_real(kube, real_node, kuberay_operator, namespace):
    kube.apply(RAY_CLUSTER, namespace=namespace)
    deadline = time.monotonic() + 300
    while True:
        rc = kubectl_json(kube, "get", "raycluster", "raycluster", "-n", namespace)
        if rc.get("status", {}).get("state") == "ready":
            break
        if time.monotonic() > deadline:
            pods = kube.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
            raise AssertionError(f"RayCluster not ready: {json.dumps(rc.get('status'), indent=1)}\n{pods}\n"
                                 f"{real_node.log_tail()}\n{kuberay_operator.log_tail(30)}")
        time.sleep(2)
    pods = kubectl_json(kube, "get", "pods", "-n", namespace, "-l", "ray.io/cluster=raycluster")["items"]
    kinds = sorted(p["metadata"]["labels"]["ray.io/node-type"] for p in pods)
    assert kinds == ["head", "worker"]
    assert all(p["status"]["phase"] == "Running" for p in pods)
    head = next(p for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "head")
    # the head's dashboard, from the host through the bridge: two Ray nodes alive
    with urllib.request.urlopen(f"http://{head['status']['podIP']}:8265/nodes?view=summary", timeout=10) as resp:
        summary = json.load(resp)
    alive = [n for n in summary["data"]["summary"] if n["raylet"]["state"] == "ALIVE"]
    assert len(alive) == 2, summary
