"""The chart's uninstall hook: as helm renders it (a pre-delete Job that runs `python -m controller.release`
with the operator's image, ServiceAccount, watched namespaces and pod security), and run for real by
`helm uninstall`, after which deleting a job's namespace, and the CRD, completes."""

from __future__ import annotations

import time

from support.chart import RELEASE, by_kind, helm, render_chart, the
from support.kubectl import apply_job, create_database_secret, get_json, wait_for_condition
from support.paths import CHART, REPO_CRDS

FINALIZER = "embedjob.dev/cleanup"
CRD = "embeddingjobs.embedjob.dev"


def test_the_uninstall_hook_releases_the_watched_namespaces_as_the_operator():
    objects = render_chart({"watchNamespaces": ["team-a", "team-b"]}, hooks=True)
    hook, deployment = the(objects, "Job"), the(objects, "Deployment")
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    assert "hook-succeeded" in hook["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    pod, operator_pod = hook["spec"]["template"]["spec"], deployment["spec"]["template"]["spec"]
    (container,), (operator,) = pod["containers"], operator_pod["containers"]
    assert container["command"] == ["python", "-m", "controller.release"]
    assert container["image"] == operator["image"]
    assert {e["name"]: e["value"] for e in container["env"]} == {"EMBEDJOB_WATCH_NAMESPACES": "team-a,team-b"}
    assert pod["serviceAccountName"] == operator_pod["serviceAccountName"]
    assert pod["securityContext"] == operator_pod["securityContext"]
    assert container["securityContext"] == operator["securityContext"]
    assert pod["restartPolicy"] == "Never" and hook["spec"]["activeDeadlineSeconds"] > 0


def test_the_uninstall_hook_can_be_turned_off():
    assert by_kind(render_chart({"releaseJobsOnUninstall": False}, hooks=True), "Job") == []


def test_after_helm_uninstall_deleting_a_namespace_and_the_crd_completes(kube, real_node, namespace,
                                                                         start_operator):
    """The documented uninstall (docs/install.md): `helm uninstall` runs the pre-delete hook as a
    Job (the real Job controller, the pod on the test node, in-cluster credentials of the chart's
    ServiceAccount); then, with no operator left, deleting a namespace that holds a job completes
    (the real namespace controller) and so does deleting the CRD while a job still exists.

    The chart is installed cluster-wide, so the hook releases every job of the API server: the CRD's
    deletion waits for every EmbeddingJob in every namespace, including those earlier tests of the
    session left behind with the finalizer when their operator stopped."""
    release_namespace, emptied, kept = namespace, f"{namespace}-gone", f"{namespace}-kept"
    for name in (emptied, kept):
        kube.kubectl("create", "namespace", name)
    helm("install", RELEASE, str(CHART), "--namespace", release_namespace, kubeconfig=kube.kubeconfig)
    operators = []
    try:
        for name in (emptied, kept):
            operators.append(start_operator(kube, name))
            create_database_secret(kube, name, "postgresql://writer:secret@db.example:5432/embed")
            # suspended: the RayJob is made, no RayCluster runs (none is needed to hold the finalizer)
            apply_job(kube, name, "held", suspend=True)
            job = wait_for_condition(kube, name, "held", "Accepted", timeout=120)
            assert job["metadata"]["finalizers"] == [FINALIZER]

        started = time.monotonic()
        # helm returns once the hook Job succeeded (a failed hook fails the uninstall)
        helm("uninstall", RELEASE, "--namespace", release_namespace, "--wait", "--timeout=300s",
             kubeconfig=kube.kubeconfig)
        uninstalled = time.monotonic() - started
        # the hook's pod ran on the test node; Helm deletes it at once, so the node's record finds it
        [hook_pod] = [p for p in real_node.pods_run(release_namespace) if "release" in p]
        hook_log = real_node.container_log(release_namespace, hook_pod, "release")
        assert f"released {emptied}/held" in hook_log and f"released {kept}/held" in hook_log, hook_log
    finally:
        for operator in operators:  # the uninstall removed the operator
            operator.stop()
    for name in (emptied, kept):
        assert "finalizers" not in get_json(kube, "ej", "held", "-n", name)["metadata"]

    try:
        started = time.monotonic()
        kube.kubectl("delete", "namespace", emptied, "--timeout=180s", timeout=200)
        namespace_seconds = time.monotonic() - started
        assert kube.kubectl("get", "namespace", emptied, check=False).returncode != 0

        started = time.monotonic()
        kube.kubectl("delete", "crd", CRD, "--timeout=180s", timeout=200)
        crd_seconds = time.monotonic() - started
        assert kube.kubectl("get", "crd", CRD, check=False).returncode != 0
    finally:  # the session's other tests need the CRD
        kube.install_crds(sorted(p for p in REPO_CRDS.glob("*.yaml") if p.name != "kustomization.yaml"))
        kube.kubectl("delete", "namespace", kept, "--wait=false", "--ignore-not-found", check=False)
    assert kube.kubectl("get", "ej", "-n", kept, "-o", "name").stdout.strip() == ""
    print(f"\nuninstall (hook Job run on the test node) {uninstalled:.0f}s; namespace deleted in "
          f"{namespace_seconds:.0f}s; CRD deleted in {crd_seconds:.0f}s")
