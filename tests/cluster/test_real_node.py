"""Pods that run for real: the real scheduler and controller-manager, and the test node.

Each test creates objects with kubectl on the envtest API server and watches what the
real kube-scheduler, kube-controller-manager (Job, garbage collector, namespace,
ServiceAccount controllers) and the test node agent make of them. Pods that reach
Services, the API server and Ray: test_real_node_network.py.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from envtest.node.agent import runtime_tmp_paths
from support.node_pods import kubectl_json, phase_in, termination_message

WIRING_SCRIPT = r"""
import json, os, socket
def ip_of_eth0():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((os.environ["HOST_IP"], 9))  # no packet is sent: this only picks the source address
    return s.getsockname()[0]
token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
try:
    open("/etc/creds/password", "a").close()
    secret_writable = True
except OSError:
    secret_writable = False
out = {k: os.environ.get(k) for k in ("PASSWORD", "GREETING", "POD_IP", "POD_NAME", "POD_NS", "MEM_LIMIT_MI",
                                      "CPU_REQUEST_M", "COMPOSED", "KUBERNETES_SERVICE_HOST")}
out.update(eth0=ip_of_eth0(), hostname=socket.gethostname(), init=open("/mnt/shared/init.txt").read().strip(),
           secret_file=open("/etc/creds/password").read(), secret_writable=secret_writable,
           token=os.path.exists(token), tmp=sorted(os.listdir("/tmp")))
print(json.dumps(out))
open("/dev/termination-log", "w").write(json.dumps(out))
"""


def test_pod_with_init_container_env_and_secret_volume_succeeds(kube, real_node, namespace):
    kube.kubectl("create", "secret", "generic", "creds", "-n", namespace, "--from-literal=password=s3cret")
    kube.kubectl("create", "configmap", "settings", "-n", namespace, "--from-literal=greeting=hello")
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wiring", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [{
                "name": "prepare", "image": "busybox",
                "command": ["sh", "-c", 'touch /tmp/init-only; echo "init ran in $(hostname)" > /mnt/shared/init.txt'],
                "volumeMounts": [{"name": "work", "mountPath": "/mnt/shared"}],
            }],
            "containers": [{
                "name": "main", "image": "python",
                "command": ["python", "-c", WIRING_SCRIPT],
                "env": [
                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                    {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "MEM_LIMIT_MI", "valueFrom": {"resourceFieldRef": {
                        "resource": "limits.memory", "divisor": "1Mi"}}},
                    {"name": "CPU_REQUEST_M", "valueFrom": {"resourceFieldRef": {
                        "resource": "requests.cpu", "divisor": "1m"}}},
                    {"name": "COMPOSED", "value": "$(GREETING)-$(POD_NAME)"},
                ],
                "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
                "volumeMounts": [{"name": "work", "mountPath": "/mnt/shared"},
                                 {"name": "creds", "mountPath": "/etc/creds", "readOnly": True}],
            }],
            "volumes": [{"name": "work", "emptyDir": {}}, {"name": "creds", "secret": {"secretName": "creds"}}],
        },
    }
    kube.kubectl("create", "-f", "-", input=json.dumps(pod))
    done = real_node.wait_for_pod(namespace, "wiring", phase_in("Succeeded", "Failed"), what="a final phase")
    assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"], indent=1)
    assert done["spec"]["nodeName"] == real_node.name  # bound by the real scheduler
    init = done["status"]["initContainerStatuses"][0]
    assert init["state"]["terminated"]["exitCode"] == 0 and init["state"]["terminated"]["reason"] == "Completed"
    out = termination_message(done, "main")
    pod_ip = done["status"]["podIP"]
    assert out == {
        "PASSWORD": "s3cret", "GREETING": "hello", "POD_IP": pod_ip, "POD_NAME": "wiring", "POD_NS": namespace,
        "MEM_LIMIT_MI": "128", "CPU_REQUEST_M": "250", "COMPOSED": "hello-wiring",
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "eth0": pod_ip, "hostname": "wiring", "init": "init ran in wiring",
        "secret_file": "s3cret", "secret_writable": False, "token": True,
        # private: nothing of the host's /tmp but where the runtime or the checkout lie there
        "tmp": sorted({path.split("/")[2] for path in runtime_tmp_paths()}),
    }
    assert pod_ip != done["status"]["hostIP"] == real_node.info["gateway"]
    # mount points that do not exist on this machine were made in the containers' namespaces only
    assert not Path("/mnt/shared").exists() and not Path("/var/run/secrets/kubernetes.io").exists()
    assert json.loads(real_node.container_log(namespace, "wiring", "main")) == out
    conditions = {c["type"]: c for c in done["status"]["conditions"]}
    assert conditions["Initialized"]["status"] == "True"
    assert conditions["Ready"]["status"] == "False" and conditions["Ready"]["reason"] == "PodCompleted"


def test_failing_container_reports_exit_code_and_failed_phase(kube, real_node, namespace):
    kube.apply(json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "fails", "namespace": namespace},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "main", "image": "x", "command": ["sh", "-c", "echo bad input >&2; exit 3"],
            "terminationMessagePolicy": "FallbackToLogsOnError"}]},
    }), namespace=namespace)
    done = real_node.wait_for_pod(namespace, "fails", phase_in("Succeeded", "Failed"), what="a final phase")
    assert done["status"]["phase"] == "Failed"
    term = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"], term["message"]) == (3, "Error", "bad input")


def test_liveness_failure_restarts_the_container_and_readiness_gates_ready(kube, real_node, namespace):
    # first run: never healthy -> killed by the liveness probe; second run (the emptyDir remembers): healthy
    script = "if [ -f /mnt/shared/ran ]; then touch /tmp/healthy; else touch /mnt/shared/ran; fi; exec sleep 600"
    probe = {"exec": {"command": ["test", "-f", "/tmp/healthy"]}, "periodSeconds": 1, "failureThreshold": 2}
    kube.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "flaky", "namespace": namespace},
        "spec": {"terminationGracePeriodSeconds": 3, "containers": [{
            "name": "app", "image": "x", "command": ["sh", "-c", script],
            "livenessProbe": probe, "readinessProbe": {**probe, "failureThreshold": 1},
            "volumeMounts": [{"name": "work", "mountPath": "/mnt/shared"}]}],
            "volumes": [{"name": "work", "emptyDir": {}}]}}))
    ready = real_node.wait_for_pod(namespace, "flaky", lambda p: any(
        c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", [])),
        what="Ready")
    status = ready["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1 and status["ready"] and "running" in status["state"]
    assert status["lastState"]["terminated"]["exitCode"] == 128 + 15  # SIGTERM from the liveness kill
    events = kubectl_json(kube, "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=flaky")["items"]
    reasons = {e["reason"] for e in events}
    assert {"Unhealthy", "Killing", "Started"} <= reasons, reasons


def test_job_runs_to_complete_through_the_job_controller(kube, real_node, namespace):
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "count", "namespace": namespace},
        "spec": {"completions": 2, "parallelism": 2, "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "work", "image": "python",
                            "command": ["python", "-c", "import os; print('index', os.environ['JOB_COMPLETION_INDEX'])"]}],
        }}, "completionMode": "Indexed"},
    }
    kube.kubectl("create", "-f", "-", input=json.dumps(job))
    kube.kubectl("wait", "--for=condition=Complete", "job/count", "-n", namespace, "--timeout=180s", timeout=200)
    status = kubectl_json(kube, "get", "job", "count", "-n", namespace)["status"]
    assert status["succeeded"] == 2 and status.get("failed", 0) == 0
    pods = kubectl_json(kube, "get", "pods", "-n", namespace, "-l", "job-name=count")["items"]
    assert sorted(p["status"]["phase"] for p in pods) == ["Succeeded", "Succeeded"]
    outputs = sorted(real_node.container_log(namespace, p["metadata"]["name"], "work").strip() for p in pods)
    assert outputs == ["index 0", "index 1"]


def test_unsatisfiable_request_stays_pending_with_the_schedulers_message(kube, real_node, namespace):
    def pod(name, resources):
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "c", "image": "x", "command": ["true"],
                    "resources": {"requests": resources, "limits": resources}}]}}

    kube.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        pod("too-big", {"cpu": "1000"}), pod("too-many-gpus", {"nvidia.com/gpu": "100"}),
        pod("one-gpu", {"nvidia.com/gpu": "1"})]}))

    def unschedulable(p):
        return any(c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
                   for c in p.get("status", {}).get("conditions", []))

    for name, resource in (("too-big", "cpu"), ("too-many-gpus", "nvidia.com/gpu")):
        pending = real_node.wait_for_pod(namespace, name, unschedulable, what="Unschedulable")
        message = next(c["message"] for c in pending["status"]["conditions"] if c["type"] == "PodScheduled")
        assert f"Insufficient {resource}" in message, message
        assert pending["status"]["phase"] == "Pending" and not pending["spec"].get("nodeName")
    # the node advertises GPUs (no GPU is used: the container runs on the CPU)
    gpu = real_node.wait_for_pod(namespace, "one-gpu", phase_in("Succeeded", "Failed"), what="a final phase")
    assert gpu["status"]["phase"] == "Succeeded"
    time.sleep(2)
    assert kubectl_json(kube, "get", "pod", "too-big", "-n", namespace)["status"]["phase"] == "Pending"


TERM_SCRIPT = r"""
import signal, sys, time
def bye(*_):
    print("got SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("running", flush=True)
while True:
    time.sleep(0.1)
"""


def test_deleting_owner_and_namespace_removes_pods_through_gc_and_namespace_controller(kube, real_node):
    ns = f"doomed-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", ns)
    # the real ServiceAccount controller creates "default" (pods are refused without it)
    deadline = time.monotonic() + 60
    while kube.kubectl("get", "serviceaccount", "default", "-n", ns, check=False).returncode != 0:
        assert time.monotonic() < deadline, "ServiceAccount controller did not create default"
        time.sleep(0.5)
    container = {"name": "sleeper", "image": "python", "command": ["python", "-c", TERM_SCRIPT]}
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "owned", "namespace": ns},
          "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "owned"}}, "template": {
              "metadata": {"labels": {"app": "owned"}},
              "spec": {"terminationGracePeriodSeconds": 5, "containers": [container]}}}}
    bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": ns},
            "spec": {"terminationGracePeriodSeconds": 5, "containers": [container]}}
    kube.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [rs, bare]}))
    kube.kubectl("wait", "--for=condition=Ready", "pod", "--all", "-n", ns, "--timeout=120s", timeout=150)
    owned = [p["metadata"]["name"] for p in kubectl_json(kube, "get", "pods", "-n", ns, "-l", "app=owned")["items"]]
    assert len(owned) == 2
    # orphan-free delete of the owner: the garbage collector deletes its pods, the node stops them
    kube.kubectl("delete", "replicaset", "owned", "-n", ns, "--cascade=background")
    kube.kubectl("wait", "--for=delete", *(f"pod/{p}" for p in owned), "-n", ns, "--timeout=120s", timeout=150)
    # the namespace controller deletes the rest and the namespace itself
    kube.kubectl("delete", "namespace", ns, "--wait=false")
    kube.kubectl("wait", "--for=delete", f"namespace/{ns}", "--timeout=180s", timeout=200)
    for name in [*owned, "bare"]:
        assert real_node.container_log(ns, name, "sleeper").splitlines() == ["running", "got SIGTERM"]


def test_agent_killed_with_sigkill_leaves_nothing_behind(kube, real_node, tmp_path):
    """A second node agent (its own run id) is SIGKILLed: its reaper removes its pods' processes,
    network namespaces, bridge and cgroups; the first node keeps running."""
    name = "embedjob-doomed-node"
    agent = real_node.start_agent(name, tmp_path)
    ns = f"kill-{uuid.uuid4().hex[:6]}"
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready.json").exists():
            assert agent.poll() is None and time.monotonic() < deadline, (tmp_path / "agent.log").read_text()
            time.sleep(0.2)
        run_id = json.loads((tmp_path / "ready.json").read_text())["run_id"]
        kube.kubectl("create", "namespace", ns)
        kube.apply(json.dumps({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
                   namespace=ns)
        kube.kubectl("create", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "orphan", "namespace": ns},
            "spec": {"nodeName": name, "containers": [{"name": "c", "image": "x", "command": ["sleep", "600"]}]}}))
        running = real_node.wait_for_pod(ns, "orphan", phase_in("Running"), what="Running")
        pid = int(running["status"]["containerStatuses"][0]["containerID"].rpartition("/")[2])
        assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"600"]
        assert any(item.startswith("netns ") for item in real_node.leftovers(run_id))
        agent.kill()
        agent.wait()
        deadline = time.monotonic() + 30
        while left := real_node.leftovers(run_id):
            assert time.monotonic() < deadline, f"left behind after SIGKILL: {left}"
            time.sleep(0.5)
        assert not Path(f"/proc/{pid}").exists() or b"sleep" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert real_node.leftovers()  # the session's own node is untouched
        kube.kubectl("delete", "pod", "orphan", "-n", ns, "--grace-period=0", "--force")
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        kube.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
        kube.kubectl("delete", "node", name, "--ignore-not-found", check=False)
