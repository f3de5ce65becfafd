"""Scale benchmark of the operator: N EmbeddingJobs at once against a real API server.

    eval "$(tests/envtest/setup)"
    python bench/operator_scale.py --jobs 1000

Starts its own etcd + kube-apiserver (tests/envtest, no KubeRay), runs `python -m
controller` cluster-wide as a ServiceAccount bound to controller.permissions, creates
N jobs in one `kubectl create`, and reports: seconds until every RayJob exists and
until every job is Accepted, the operator's peak RSS (VmHWM), and the API requests
per job the operator made (from the apiserver's `apiserver_request_total`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from envtest.binaries import find_binaries  # noqa: E402
from envtest.control_plane import running_control_plane  # noqa: E402
from support.manifests import ej_manifest  # noqa: E402
from support.net import free_port  # noqa: E402
from support.polling import wait_until  # noqa: E402

from controller import permissions  # noqa: E402
from scratch import scratch_dir  # noqa: E402

NAMESPACE = "bench"
# (verb, resource, subresource) that only the operator issues in this benchmark.
OPERATOR_REQUESTS = {
    ("PATCH", "embeddingjobs", ""), ("PATCH", "embeddingjobs", "status"), ("POST", "rayjobs", ""),
    ("GET", "rayjobs", ""), ("GET", "secrets", ""), ("POST", "events", ""), ("DELETE", "rayjobs", ""),
}
METRIC = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$')


def request_counts(kube) -> Counter:
    counts: Counter = Counter()
    for line in kube.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        match = METRIC.match(line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            counts[(labels.get("verb"), labels.get("resource"), labels.get("subresource", ""))] += float(match["value"])
    return counts


def operator_kubeconfig(kube) -> str:
    rules = permissions.policy_rules(permissions.cluster_rules(clusterwide=True))
    items = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "embedjob-operator", "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "embedjob-bench"},
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "embedjob-bench"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "embedjob-bench"},
         "subjects": [{"kind": "ServiceAccount", "name": "embedjob-operator", "namespace": NAMESPACE}]},
    ]
    kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return kube.kubeconfig_for_serviceaccount(NAMESPACE, "embedjob-operator")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def count(kube, kind: str, jsonpath: str) -> int:
    out = kube.kubectl("get", kind, "-n", NAMESPACE, "-o", f"jsonpath={jsonpath}", timeout=300).stdout
    return len(out.split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args()

    workdir = scratch_dir("embedjob-bench-")
    operator = None
    with running_control_plane(workdir, find_binaries()) as kube:
        try:
            kube.kubectl("create", "namespace", NAMESPACE)
            kube.kubectl("create", "secret", "generic", "embedjob-db", "-n", NAMESPACE,
                         "--from-literal=url=postgresql://writer:pw@db/embed")
            env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDJOB_")}
            env.update(KUBECONFIG=operator_kubeconfig(kube), EMBEDJOB_LOG_FORMAT="json",
                       EMBEDJOB_HEALTH_PORT=str(free_port()), EMBEDJOB_METRICS_PORT=str(free_port()))
            with open(workdir / "operator.log", "wb") as log:
                operator = subprocess.Popen([sys.executable, "-m", "controller"], cwd=REPO, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
            time.sleep(3)  # the operator's initial listing of empty resources

            jobs = [json.loads(ej_manifest(f"job-{i:05d}")) for i in range(args.jobs)]
            before = request_counts(kube)
            started = time.monotonic()
            kube.kubectl("create", "-n", NAMESPACE, "-f", "-", "-o", "name",
                         input=json.dumps({"apiVersion": "v1", "kind": "List", "items": jobs}), timeout=600)
            created = time.monotonic() - started
            wait_until("every RayJob", lambda: count(kube, "rayjobs", "{.items[*].metadata.name}") >= args.jobs,
                       timeout=600, interval=1)
            all_rayjobs = time.monotonic() - started
            accepted = "{.items[*].status.conditions[?(@.type=='Accepted')].status}"
            wait_until("every job Accepted", lambda: count(kube, "ej", accepted) >= args.jobs, timeout=600, interval=1)
            all_accepted = time.monotonic() - started
            time.sleep(5)  # let the last status patches and Events land
            delta = request_counts(kube) - before
            by_operator = {f"{verb} {resource}{'/' + sub if sub else ''}": int(n)
                           for (verb, resource, sub), n in sorted(delta.items()) if (verb, resource, sub) in OPERATOR_REQUESTS}
            result = {
                "jobs": args.jobs,
                "create_seconds": round(created, 1),
                "all_rayjobs_seconds": round(all_rayjobs, 1),
                "all_accepted_seconds": round(all_accepted, 1),
                "operator_peak_rss_mb": round(peak_rss_mb(operator.pid), 1),
                "operator_requests_per_job": round(sum(by_operator.values()) / args.jobs, 2),
                "operator_requests": by_operator,
                "cpus": os.cpu_count(),
            }
            print(json.dumps(result, indent=2))
        finally:
            if operator is not None:
                os.killpg(operator.pid, signal.SIGTERM)
                operator.wait(60)


if __name__ == "__main__":
    main()
