"""Containers from the images the test harness built (envtest.images): a container whose `image` is one of them
runs from it with runc (envtest.images.runtime) in the pod's network namespace, with the pod's env, mounts and
user; one that is not built is the pod's ErrImagePull, then ImagePullBackOff, as a kubelet reports a failed pull.
Containers with any other image run on the host's file system as before (pods.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from envtest.images.build import image_exists
from envtest.images.runtime import image_config, options_for

from .runs import CGROUP_ROOT

#: the repository the harness tags its images in (envtest.images.build)
HARNESS_IMAGES = "localhost/embedjob-test/"
NETNS_DIR = Path("/var/run/netns")


def from_harness(image: str) -> bool:
    return image.startswith(HARNESS_IMAGES)


def pull_failure(image: str, failures: int) -> dict | None:
    """The waiting state of a container whose image is not there (the ``failures``-th time), or None when it is."""
    if image_exists(image):
        return None
    if failures <= 1:
        return {"reason": "ErrImagePull", "message": f"image {image} was not built by the test harness"}
    return {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}


def image_env(image: str) -> dict[str, str]:
    """The image's ENV, the base the container's own env overrides."""
    return dict(entry.split("=", 1) for entry in image_config(image).get("Env", []))


def container_argv(image: str, spec: dict) -> list[str]:
    """What runs, as a kubelet decides: `command` replaces the ENTRYPOINT (and drops the CMD), `args` the CMD."""
    config = image_config(image)
    command = spec.get("command") or config.get("Entrypoint") or []
    args = spec.get("args") or ([] if spec.get("command") else config.get("Cmd") or [])
    return [*command, *args]


def start(pod_spec: dict, spec: dict, argv: list[str], env: dict, mounts: list[dict], netns: str, hostname: str,
          cgroup: Path, spec_path: Path, log_path: Path) -> subprocess.Popen:
    """Start the container with runc; the process is envtest.images.runtime's, outside ``cgroup`` (the container's
    processes are in it). Raises ContainerConfigError for what a kubelet would refuse (runAsNonRoot as root)."""
    options = options_for(pod_spec, spec, image_config(spec["image"]).get("User", ""))
    options = dataclasses.replace(
        options, env=env, tmpfs=(), cwd=spec.get("workingDir"), hostname=hostname,
        network_namespace=str(NETNS_DIR / netns), cgroups_path="/" + str(cgroup.relative_to(CGROUP_ROOT)),
        # the host's /etc/profile is no part of an image
        binds=tuple((m["src"], m["dst"], bool(m.get("readonly"))) for m in mounts if m["dst"] != "/etc/profile"))
    # the kubelet makes the termination-message file writable for any user of the container
    termination_log = spec.get("terminationMessagePath", "/dev/termination-log")
    for mount in mounts:
        if mount["dst"] == termination_log:
            os.chmod(mount["src"], 0o666)
    spec_path.write_text(json.dumps({"reference": spec["image"], "argv": argv,
                                     "options": dataclasses.asdict(options)}))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tests_dir = Path(__file__).resolve().parents[2]
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "envtest.images.runtime", str(spec_path)], cwd=tests_dir,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

