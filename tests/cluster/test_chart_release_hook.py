"""The chart's uninstall hook as helm renders it: a pre-delete Job that runs `python -m controller.release`
with the operator's image, ServiceAccount, watched namespaces and pod security."""

from __future__ import annotations

from support.chart import by_kind, render_chart, the


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
