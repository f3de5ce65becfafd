"""The real images, built from our Dockerfiles with buildah on a Debian stand-in for their upstream bases
(envtest.images.build) and run with runc as the chart and KubeRay run them: the controller with a read-only root
filesystem as its non-root uid, serving a job against the real API server; the worker without a compiler, as
non-root, with the driver's entrypoint. Their sizes are reported (printed, and written to image-sizes.txt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embedjob.contract import DRIVER_MODULE
from envtest.images.build import Image, image_size_bytes
from envtest.images.runtime import (
    HOST_NETWORK,
    ContainerConfigError,
    image_config,
    options_for,
    run_in_image,
    running_container,
)
from plugins.harness_images import worker_image_timeout
from plugins.operator_process import grant_operator_permissions
from support.chart import render_chart, the
from support.kubectl import apply_job, create_database_secret, wait_for_rayjobs
from support.net import free_port
from support.processes import http_ok, wait_for
from support.project import pinned_ray_version

pytestmark = pytest.mark.k8s

HEAVY_MODULES = ("ray", "torch", "sentence_transformers", "transformers")
KUBECONFIG_IN_POD = "/var/run/secrets/embedjob/kubeconfig"
COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "tcc")


def operator_pod() -> tuple[dict, dict]:
    """The pod spec and container of the operator's Deployment as the chart renders it."""
    pod_spec = the(render_chart(), "Deployment")["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    return pod_spec, container


def as_the_chart_runs_it(image: Image, **env: str):
    pod_spec, container = operator_pod()
    options = options_for(pod_spec, container, image_config(image.reference).get("User", ""))
    options.env |= env
    return options


def test_the_chart_runs_the_operator_read_only_and_non_root():
    pod_spec, container = operator_pod()
    options = options_for(pod_spec, container, "0")
    assert options.read_only_root and options.drop_all_capabilities
    assert options.user[0] != 0 and options.tmpfs == ("/tmp",)
    # the kubelet's runAsNonRoot refusal: an image user 0 without runAsUser in the pod
    del pod_spec["securityContext"]["runAsUser"]
    with pytest.raises(ContainerConfigError, match="runAsNonRoot"):
        options_for(pod_spec, container, "0")


def test_controller_image_imports_the_operator_read_only_as_its_non_root_user(controller_image):
    options = as_the_chart_runs_it(controller_image)
    script = ("import importlib.util, json, os, controller.handlers\n"
              f"print(json.dumps([os.getuid(), [m for m in {HEAVY_MODULES!r} if importlib.util.find_spec(m)]]))\n"
              "open('/tmp/writable', 'w').close()\n"
              "try:\n    open('/written-to-root', 'w')\nexcept OSError as exc:\n    print(exc.strerror)\n")
    result = run_in_image(controller_image.reference, ["python", "-c", script], options)
    assert result.returncode == 0, result.stderr[-3000:]
    uid_and_heavy, root_write = result.stdout.splitlines()
    assert json.loads(uid_and_heavy) == [options.user[0], []]
    assert root_write == "Read-only file system"
    assert options.user[0] == int(image_config(controller_image.reference)["User"].split(":")[0])


def test_controller_image_entrypoint_reports_bad_settings_without_a_traceback(controller_image):
    options = as_the_chart_runs_it(controller_image, EMBEDJOB_HEALTH_PORT="eighty")
    config = image_config(controller_image.reference)
    result = run_in_image(controller_image.reference, config["Entrypoint"], options)
    assert result.returncode == 1
    assert result.stderr.strip() == "embedjob-operator: EMBEDJOB_HEALTH_PORT='eighty' is not an integer"


def test_operator_from_its_image_serves_a_job_against_the_api_server(controller_image, kube, namespace, tmp_path):
    health_port = free_port()
    # mounted as a kubelet mounts a Secret: a file the container's user can read, at a path in the container
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(Path(grant_operator_permissions(kube, namespace)).read_text())
    kubeconfig.chmod(0o644)
    options = as_the_chart_runs_it(
        controller_image, KUBECONFIG=KUBECONFIG_IN_POD, EMBEDJOB_WATCH_NAMESPACES=namespace,
        EMBEDJOB_HEALTH_PORT=str(health_port), EMBEDJOB_METRICS_PORT=str(free_port()), EMBEDJOB_LOG_FORMAT="plain")
    # the test API server listens on the host's loopback: the pod gets the host's network (hostNetwork)
    options.network_namespace = HOST_NETWORK
    options.binds += ((str(kubeconfig), KUBECONFIG_IN_POD, True),)
    log = tmp_path / "operator.log"
    entrypoint = image_config(controller_image.reference)["Entrypoint"]
    with running_container(controller_image.reference, entrypoint, options, log) as process:
        wait_for("the operator's /healthz", lambda: http_ok(f"http://127.0.0.1:{health_port}/healthz"), 120,
                 process, log)
        create_database_secret(kube, namespace, "postgresql://writer:secret@db.example:5432/embed")
        apply_job(kube, namespace, "from-image")
        rayjob = wait_for_rayjobs(kube, namespace, timeout=60)[0]
        assert rayjob["spec"]["entrypoint"].startswith(f"python -m {DRIVER_MODULE} ")
    assert "Traceback" not in log.read_text(errors="replace")


@worker_image_timeout
def test_worker_image_runs_as_non_root_and_has_no_compiler(worker_image):
    config = image_config(worker_image.reference)
    uid = int(config["User"].split(":")[0])
    assert uid != 0
    probe = f"id -u; for c in {' '.join(COMPILERS)}; do command -v $c || true; done"
    result = run_in_image(worker_image.reference, ["sh", "-c", probe])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [str(uid)], f"compilers in the worker image: {result.stdout.split()[1:]}"


@worker_image_timeout
def test_a_login_shell_in_the_worker_image_keeps_its_python_on_path(worker_image):
    """KubeRay runs the Ray containers' commands with `bash -lc`: the login shell's /etc/profile must leave
    the image's Python (and its `ray`) first on PATH, as the upstream Ray image's does."""
    result = run_in_image(worker_image.reference, ["/bin/bash", "-lc", "--", "command -v python ray"])
    assert result.returncode == 0, result.stderr[-3000:]
    image_path = dict(e.split("=", 1) for e in image_config(worker_image.reference)["Env"])["PATH"]
    python_dir = image_path.split(":")[0]
    assert result.stdout.split() == [f"{python_dir}/python", f"{python_dir}/ray"], result.stdout


@worker_image_timeout
def test_worker_image_runs_the_driver_entrypoint_the_operator_puts_into_rayjobs(worker_image):
    result = run_in_image(worker_image.reference, ["python", "-m", DRIVER_MODULE, "--help"], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--config-b64" in result.stdout
    versions = run_in_image(worker_image.reference, ["python", "-c", "import ray, torch; print(ray.__version__)"],
                            timeout=600)
    assert versions.returncode == 0, versions.stderr[-3000:]
    assert versions.stdout.strip() == pinned_ray_version()


@worker_image_timeout
def test_image_sizes_are_reported(controller_image, worker_image, tmp_path):
    sizes = {image.name: image_size_bytes(image.reference) for image in (controller_image, worker_image)}
    lines = [f"{name} image: {size / 1e6:.0f} MB ({ref.reference})" for (name, size), ref
             in zip(sizes.items(), (controller_image, worker_image))]
    report = tmp_path / "image-sizes.txt"
    report.write_text("\n".join(lines) + "\n")
    print("\n" + report.read_text() + f"(written to {report})")
    assert 0 < sizes["controller"] < sizes["worker"]


# ------------------------------------------------------------ pods on the test node, from the images

POD_SCRIPT = r"""
import json, os, socket, controller
try:
    open("/written-to-root", "w")
    root = "writable"
except OSError as exc:
    root = exc.strerror
out = {"uid": os.getuid(), "greeting": os.environ.get("GREETING"), "path": os.environ.get("PATH"),
       "hostname": socket.gethostname(), "controller": controller.__file__, "root": root,
       "hosts": "localhost" in open("/etc/hosts").read(), "cwd": os.getcwd()}
open("/dev/termination-log", "w").write(json.dumps(out))
"""


def test_a_pod_runs_from_the_controller_image_on_the_test_node(kube, real_node, namespace, controller_image):
    kube.apply(json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "from-image", "namespace": namespace},
        "spec": {"restartPolicy": "Never", "securityContext": {"runAsNonRoot": True}, "containers": [{
            "name": "main", "image": controller_image.reference, "command": ["python", "-c", POD_SCRIPT],
            "env": [{"name": "NAME", "value": "world"}, {"name": "GREETING", "value": "hello $(NAME)"}],
            "securityContext": {"readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}}]},
    }), namespace=namespace)
    done = real_node.wait_for_pod(namespace, "from-image", lambda pod: pod.get("status", {}).get("phase") in
                                  ("Succeeded", "Failed"), what="a final phase")
    term = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert done["status"]["phase"] == "Succeeded", term
    out = json.loads(term["message"])
    config = image_config(controller_image.reference)
    image_env = dict(e.split("=", 1) for e in config["Env"])
    assert out == {"uid": int(config["User"].split(":")[0]), "greeting": "hello world",
                   "path": image_env["PATH"], "hostname": "from-image",
                   # the package installed in the image, not this checkout
                   "controller": "/opt/python/lib/python3.11/site-packages/controller/__init__.py",
                   "root": "Read-only file system", "hosts": True, "cwd": config["WorkingDir"]}


def test_a_pod_whose_image_was_not_built_waits_in_image_pull_back_off(kube, real_node, namespace):
    kube.apply(json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "no-image", "namespace": namespace},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "main", "image": "localhost/embedjob-test/never-built:0"}]},
    }), namespace=namespace)
    reasons = set()

    def backing_off(pod: dict) -> bool:
        for status in pod.get("status", {}).get("containerStatuses", []):
            reasons.add(status["state"].get("waiting", {}).get("reason"))
        return "ImagePullBackOff" in reasons

    pod = real_node.wait_for_pod(namespace, "no-image", backing_off, what="ImagePullBackOff", timeout=90)
    assert "ErrImagePull" in reasons  # the first failed pull, before the back-off
    assert pod["status"]["phase"] == "Pending"


@worker_image_timeout
def test_a_pod_runs_the_driver_from_the_worker_image_on_the_test_node(worker_image, kube, real_node, namespace):
    kube.apply(json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "driver-help", "namespace": namespace},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "main", "image": worker_image.reference,
            "command": ["sh", "-c", f"id -u && python -m {DRIVER_MODULE} --help"]}]},
    }), namespace=namespace)
    done = real_node.wait_for_pod(namespace, "driver-help", lambda pod: pod.get("status", {}).get("phase") in
                                  ("Succeeded", "Failed"), what="a final phase", timeout=300)
    log = real_node.container_log(namespace, "driver-help", "main")
    assert done["status"]["phase"] == "Succeeded", log[-3000:]
    uid, *help_text = log.splitlines()
    assert uid == image_config(worker_image.reference)["User"].split(":")[0] != "0"
    assert "--config-b64" in "\n".join(help_text)
