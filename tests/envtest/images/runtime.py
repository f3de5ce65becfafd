"""Runs a container from a test image with runc: a copy-on-write root filesystem per container (a buildah working
container's overlay mount of the image), the image's env, user and working directory, and what a pod's
securityContext sets on top (read-only root, dropped capabilities, another user, tmpfs and bind mounts)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from envtest.images.build import buildah
from support.processes import stop

RUNC_ROOT = Path("/run/embedjob-test-runc")
_names = itertools.count()


@dataclass
class ContainerOptions:
    """What a pod's container spec and securityContext set on top of the image's config."""
    user: tuple[int, int] | None = None  #: (uid, gid); None: the image's USER
    read_only_root: bool = False
    drop_all_capabilities: bool = False
    env: dict[str, str] = field(default_factory=dict)
    tmpfs: tuple[str, ...] = ()  #: container paths that get an empty, writable tmpfs (emptyDir)
    binds: tuple[tuple[str, str, bool], ...] = ()  #: (host path, container path, read-only)
    network_namespace: str | None = None  #: a path under /var/run/netns; None: a new, empty one
    cwd: str | None = None  #: None: the image's WORKDIR
    hostname: str | None = None
    cgroups_path: str | None = None  #: relative to each cgroup (v1) hierarchy; None: runc's default


def image_config(reference: str) -> dict:
    """The image's OCI config: Env, User, WorkingDir, Entrypoint, Cmd."""
    inspected = json.loads(buildah("inspect", "--type", "image", reference).stdout)
    return inspected["OCIv1"].get("config", {})


def numeric_user(user: str) -> tuple[int, int]:
    """The image's USER as (uid, gid); our images set numeric ids, as a kubelet needs for runAsNonRoot."""
    uid, _, gid = (user or "0").partition(":")
    if not uid.isdigit() or not (gid or "0").isdigit():
        raise ValueError(f"the image's USER {user!r} is not numeric: runAsNonRoot cannot verify it")
    return int(uid), int(gid or 0)


@contextlib.contextmanager
def copy_on_write_rootfs(reference: str) -> Iterator[str]:
    """A fresh writable layer over the image, mounted; removed again afterwards."""
    container = buildah("from", "--pull=never", "--quiet", reference).stdout.strip()
    try:
        yield buildah("mount", container).stdout.strip()
    finally:
        buildah("rm", container)


def oci_spec(bundle: Path, rootfs: str, config: dict, argv: list[str], options: ContainerOptions) -> dict:
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True, capture_output=True)
    spec = json.loads((bundle / "config.json").read_text())
    uid, gid = options.user or numeric_user(config.get("User", ""))
    env = dict(entry.split("=", 1) for entry in config.get("Env", []))
    process = spec["process"]
    process.update(terminal=False, args=argv, cwd=options.cwd or config.get("WorkingDir") or "/",
                   env=[f"{k}={v}" for k, v in (env | options.env).items()],
                   user={"uid": uid, "gid": gid}, noNewPrivileges=True)
    if options.drop_all_capabilities:
        process["capabilities"] = {kind: [] for kind in process["capabilities"]}
    spec["root"] = {"path": rootfs, "readonly": options.read_only_root}
    spec["mounts"] += [{"destination": path, "type": "tmpfs", "source": "tmpfs",
                        "options": ["nosuid", "nodev", "mode=1777", "size=65536k"]} for path in options.tmpfs]
    spec["mounts"] += [{"destination": inside, "type": "bind", "source": host,
                        "options": ["rbind", "ro" if read_only else "rw"]} for host, inside, read_only in options.binds]
    if options.hostname:
        spec["hostname"] = options.hostname
    if options.cgroups_path:
        spec["linux"]["cgroupsPath"] = options.cgroups_path
    if options.network_namespace:
        spec["linux"]["namespaces"] = [ns for ns in spec["linux"]["namespaces"] if ns["type"] != "network"]
        spec["linux"]["namespaces"].append({"type": "network", "path": options.network_namespace})
    return spec


RUNC = ["runc", "--root", str(RUNC_ROOT)]
#: ContainerOptions.network_namespace for the test process's own network (a pod with hostNetwork)
HOST_NETWORK = f"/proc/{os.getpid()}/ns/net"


@contextlib.contextmanager
def prepared_container(reference: str, argv: list[str], options: ContainerOptions) -> Iterator[list[str]]:
    """The `runc run` command of a new container of the image; the container is deleted afterwards."""
    name = f"embedjob-test-{os.getpid()}-{next(_names)}"
    with copy_on_write_rootfs(reference) as rootfs, tempfile.TemporaryDirectory(prefix="runc-bundle-") as bundle:
        spec = oci_spec(Path(bundle), rootfs, image_config(reference), argv, options)
        (Path(bundle) / "config.json").write_text(json.dumps(spec))
        try:
            yield [*RUNC, "run", "--bundle", bundle, name]
        finally:
            subprocess.run([*RUNC, "delete", "--force", name], capture_output=True)
            if options.cgroups_path:
                remove_empty_parents(options.cgroups_path)


def remove_empty_parents(cgroups_path: str) -> None:
    """runc deletes the container's cgroups but not the parents it made for them in each (v1) hierarchy; the
    pids hierarchy's belong to the test node, which removes them itself."""
    parents = Path(cgroups_path.lstrip("/")).parents
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        if hierarchy.name == "pids" or hierarchy.is_symlink():
            continue
        for parent in (p for p in parents if p != Path(".")):
            try:
                (hierarchy / parent).rmdir()
            except OSError:  # not there, or still in use
                break


def run_in_image(reference: str, argv: list[str], options: ContainerOptions | None = None,
                 timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs ``argv`` in a new container of the image and waits for it."""
    with prepared_container(reference, argv, options or ContainerOptions()) as command:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def running_container(reference: str, argv: list[str], options: ContainerOptions,
                      log_path: Path) -> Iterator[subprocess.Popen]:
    """``argv`` running in a new container of the image (output to ``log_path``); stopped with SIGTERM on exit."""
    with prepared_container(reference, argv, options) as command, open(log_path, "wb") as log:
        # runc run stays in the foreground and forwards the signals it gets to the container's process
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            yield process
        finally:
            stop(process, timeout=30)


class ContainerConfigError(ValueError):
    """What a kubelet reports as the pod's CreateContainerConfigError (e.g. runAsNonRoot with a root user)."""


def options_for(pod_spec: dict, container: dict, image_user: str) -> ContainerOptions:
    """The runc options a kubelet would derive from a pod's spec and securityContexts for one of its containers
    (plain `value` env entries and emptyDir mounts; the test node adds what it resolves itself)."""
    pod_context, context = pod_spec.get("securityContext") or {}, container.get("securityContext") or {}

    def setting(name: str):
        return context.get(name, pod_context.get(name))

    uid, gid = numeric_user(image_user)
    uid = setting("runAsUser") if setting("runAsUser") is not None else uid
    gid = setting("runAsGroup") if setting("runAsGroup") is not None else gid
    if setting("runAsNonRoot") and uid == 0:
        raise ContainerConfigError(f"container {container['name']!r} has runAsNonRoot and would run as uid 0")
    empty_dirs = {v["name"] for v in pod_spec.get("volumes", []) if "emptyDir" in v}
    return ContainerOptions(
        user=(uid, gid),
        read_only_root=bool(context.get("readOnlyRootFilesystem")),
        drop_all_capabilities="ALL" in (context.get("capabilities") or {}).get("drop", []),
        env={e["name"]: e["value"] for e in container.get("env", []) if "value" in e},
        tmpfs=tuple(m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in empty_dirs),
    )


def options_from_json(data: dict) -> ContainerOptions:
    tuples = {"user": tuple, "tmpfs": tuple, "binds": lambda binds: tuple(tuple(b) for b in binds)}
    return ContainerOptions(**{k: tuples[k](v) if k in tuples and v is not None else v for k, v in data.items()})


def main(spec_path: str) -> int:
    """The test node's container process (``python -m envtest.images.runtime SPEC.json``): runs the container
    ({"reference", "argv", "options"}) in the foreground, passes SIGTERM/SIGINT on, removes the container
    after it exits and exits with its status. It stays outside the container's cgroup, so that the node's
    SIGKILL of that cgroup still lets it clean up."""
    spec = json.loads(Path(spec_path).read_text())
    with prepared_container(spec["reference"], spec["argv"], options_from_json(spec["options"])) as command:
        runc = subprocess.Popen(command)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda received, _frame: runc.send_signal(received))
        code = runc.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
