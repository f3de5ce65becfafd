"""Starting one container of a pod on the test node: its image or host command, env, mounts,
cgroup and probes.

What cannot be resolved yet (a missing Secret key, a mount that cannot be made, an image's bad
config) leaves the container waiting with CreateContainerConfigError, tried again 2 s later, as the
kubelet does; an image that cannot be pulled backs off; a process that cannot start ends the
container with StartError.
"""

from __future__ import annotations

import shlex
import time
from typing import TYPE_CHECKING

from envtest.images.runtime import ContainerConfigError

from . import envvars, images, probes, volumes
from .containers import BACKOFF_MAX, Container, Run, container_mounts, launch
from .kubeapi import ApiError, now_rfc3339

if TYPE_CHECKING:
    from .pods import PodWorker

CONFIG_RETRY_S = 2


def start_container(worker: PodWorker, c: Container) -> None:
    node, sandbox, pod, spec = worker.node, worker.sandbox, worker.latest(), c.spec
    base = {**node.image_env, "PATH": node.path, "HOSTNAME": sandbox.hostname, "HOME": "/root"}
    in_image = images.from_harness(spec.get("image", ""))
    if in_image:
        c.pull_failures += 1
        waiting = images.pull_failure(spec["image"], c.pull_failures)
        if waiting is not None:
            c.state = {"waiting": waiting}
            c.next_start = time.monotonic() + min(BACKOFF_MAX, 5 * 2 ** c.pull_failures)
            return
        c.pull_failures = 0
        base = {**images.image_env(spec["image"]), "HOSTNAME": sandbox.hostname}
    cdir = worker.dir / "containers" / f"{c.name}-{c.restarts}"
    log_path = worker.dir / "logs" / f"{c.name}-{c.restarts}.log"
    cgroup = node.names.cgroup / f"{worker.uid[:8]}-{c.name}-{c.restarts}"
    try:
        env = envvars.resolve(_with_addresses(pod, sandbox.pod_ip, node.network.gateway), spec, sandbox.lookup,
                              base, node.services.service_env(worker.ns), node.allocatable)
        unexpanded = (images.container_argv(spec["image"], spec) if in_image
                      else spec.get("command", []) + spec.get("args", []))
        argv = [envvars.expand(a, env) for a in unexpanded]
        pod_files = {"/etc/hosts": sandbox.hosts, "/etc/resolv.conf": sandbox.resolv}
        mounts = container_mounts(spec, env, cdir, pod_files, [] if in_image else node.tmp_keep, sandbox.volumes)
        cgroup.mkdir(parents=True, exist_ok=True)
        if in_image:
            proc, error = images.start(pod["spec"], spec, argv, env, mounts, sandbox.netns, sandbox.hostname,
                                       cgroup, cdir / "container.json", log_path), ""
        else:
            launch_spec = {"hostname": sandbox.hostname, "mounts": mounts, "cwd": spec.get("workingDir") or "/",
                           "masks": [{"dst": "/root", "keep": node.home_keep}], "argv": argv, "env": env}
            proc, error = launch(sandbox.netns, cgroup, cdir / "launch.json", launch_spec, log_path)
    except (envvars.EnvError, ApiError, volumes.VolumeError, ContainerConfigError) as exc:
        c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
        c.next_start = time.monotonic() + CONFIG_RETRY_S
        return
    started = now_rfc3339()
    if error:
        worker.log(f"container {c.name} failed to start: {error}")
        node.event(pod, "Failed", f"Error: {error}", "Warning")
        worker.terminated(c, {"exitCode": 128, "reason": "StartError", "message": error,
                              "startedAt": started, "finishedAt": now_rfc3339()})
        return
    run = Run(proc=proc, cgroup=cgroup, log=log_path, termlog=cdir / "termination-log", env=env,
              started_at=started, t0=time.monotonic())
    c.run = run
    c.state = {"running": {"startedAt": started}}
    node.event(pod, "Started", f"Started container {c.name}")
    worker.log(f"container {c.name} started (pid {proc.pid}): {shlex.join(argv)[:200]!r}")
    if not c.init:
        _start_probers(run, spec, sandbox.pod_ip, proc.pid, env)


def _start_probers(run: Run, spec: dict, pod_ip: str, pid: int, env: dict) -> None:
    """Readiness and liveness probes wait for the startup probe's first success, if it has one."""
    gate = None
    if spec.get("startupProbe"):
        run.probers["startupProbe"] = probes.Prober("startup", spec["startupProbe"], spec, pod_ip, pid, env)
        gate = run.startup_ok
    else:
        run.startup_ok.set()
    for kind in ("readinessProbe", "livenessProbe"):
        if spec.get(kind):
            run.probers[kind] = probes.Prober(kind.replace("Probe", ""), spec[kind], spec, pod_ip, pid, env, gate)
    for prober in run.probers.values():
        prober.start()


def _with_addresses(pod: dict, pod_ip: str, host_ip: str) -> dict:
    """``pod`` with the addresses this node gave it (the API object may not show them yet)."""
    status = {**pod.get("status", {}), "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
              "hostIP": host_ip, "hostIPs": [{"ip": host_ip}]}
    return {**pod, "status": status}
