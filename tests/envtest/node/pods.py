"""One pod on the test node, from its sandbox to its deletion (a thread per pod).

Sandbox: a network namespace with the pod's IP on the run's bridge, the pod's
/etc/hosts and /etc/resolv.conf (kept current by services.py), its volumes.
Init containers run one at a time, in order, each to success; then every container
starts (each one's process tree, exit record and restart back-off: containers.py);
restarts follow ``restartPolicy``. Probes: probes.py.

The status written back (strategic merge patch of pods/status) carries phase,
conditions (PodReadyToStartContainers, Initialized, ContainersReady, Ready), pod and
host IPs, startTime and a status per container (waiting/running/terminated with exit
code, reason, termination message, restartCount, lastState, ready, started).

Deletion: preStop is not run; SIGTERM to each container's main process, the pod's
grace period, SIGKILL to whatever is left in its cgroups, then the pod object is
deleted with grace 0 (UID precondition), as the kubelet does.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from envtest.images.runtime import ContainerConfigError

from . import envvars, images, probes, volumes
from .containers import BACKOFF_MAX, Container, Run, container_mounts, launch, stop_run
from .kubeapi import ApiError, now_rfc3339

if TYPE_CHECKING:
    from .agent import Node

POLL = 0.2


class PodWorker(threading.Thread):
    def __init__(self, node: "Node", pod: dict):
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.node, self.pod = node, pod
        self.ns, self.pod_name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = node.workdir / "pods" / f"{self.ns}_{self.pod_name}_{self.uid[:8]}"
        self._lock = threading.Lock()
        self._latest = pod
        self.gone = threading.Event()  # the API object no longer exists
        self.stopping = threading.Event()  # the agent shuts down
        self.slot: int | None = None
        self.netns = ""
        self.pod_ip = ""
        self.volumes: dict[str, Path] = {}
        self.memory_dirs: list[Path] = []
        self.start_time = ""
        self.conditions: dict[str, dict] = {}
        self.phase = "Pending"
        spec = pod["spec"]
        self.inits = [Container(c, True) for c in spec.get("initContainers", [])]
        self.containers = [Container(c, False) for c in spec["containers"]]
        self._patched: str = ""
        self.sandbox_down = False

    # -- called from the agent's threads -------------------------------------------------
    def update(self, pod: dict) -> None:
        with self._lock:
            self._latest = pod

    def latest(self) -> dict:
        with self._lock:
            return self._latest

    def log(self, msg: str) -> None:
        self.node.log(f"pod {self.ns}/{self.pod_name}: {msg}")

    # -- the thread ----------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._run()
        except Exception:  # noqa: BLE001 - a pod's failure must not take the agent down
            self.log("worker crashed:\n" + traceback.format_exc())
            self._kill_all(grace=0)
        finally:
            self._teardown_sandbox()
            self.node.worker_done(self)

    def _deleting(self) -> bool:
        return bool(self.latest()["metadata"].get("deletionTimestamp"))

    def _run(self) -> None:
        if self._interrupted():  # deleted before it ever ran here
            return self._finish()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.start_time = now_rfc3339()
        self._set_condition("PodScheduled", "True")
        self._sandbox()
        self._sync()
        while not self._volumes_ready():
            if self._interrupted():
                return self._finish()
            self._sync()
            time.sleep(2)
        # init containers, in order
        for c in self.inits:
            while not c.done:
                if self._interrupted():
                    return self._finish()
                self._step(c)
                self._compute_phase()
                if self.phase == "Failed":
                    break
                self._sync()
                time.sleep(POLL)
            if self.phase == "Failed":
                break
        if self.phase != "Failed":
            self._set_condition("Initialized", "True")
            while True:
                if self._interrupted():
                    return self._finish()
                for c in self.containers:
                    self._step(c)
                if all(c.done for c in self.containers):
                    break
                self._sync()
                time.sleep(POLL)
        # terminal: the sandbox goes, the pod object stays until it is deleted
        self._sync()
        self._teardown_sandbox()
        while not self._interrupted():
            time.sleep(POLL)
        self._finish()

    def _interrupted(self) -> bool:
        return self._deleting() or self.gone.is_set() or self.stopping.is_set()

    def _finish(self) -> None:
        """Deleted (or the agent stops): stop the containers, then remove the pod object."""
        meta = self.latest()["metadata"]
        if self.gone.is_set() or self.stopping.is_set():
            grace = 0 if self.gone.is_set() else 2
        else:
            grace = meta.get("deletionGracePeriodSeconds",
                             self.pod["spec"].get("terminationGracePeriodSeconds", 30))
        self._kill_all(grace=grace, reason="Killing")
        if self.stopping.is_set() or self.gone.is_set():
            return
        self._sync()
        try:
            self.node.client.delete(f"/api/v1/namespaces/{self.ns}/pods/{self.pod_name}",
                                    {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                                     "preconditions": {"uid": self.uid}})
        except ApiError as exc:
            if exc.status not in (404, 409):
                self.log(f"delete failed: {exc}")

    # -- sandbox and volumes -------------------------------------------------------------
    def _sandbox(self) -> None:
        self.slot, self.netns, self.pod_ip = self.node.network.add_pod()
        self.log(f"sandbox {self.netns} ip {self.pod_ip}")
        spec = self.pod["spec"]
        hostname = spec.get("hostname") or self.pod_name
        self.hostname = hostname[:63]
        own = f"{self.pod_ip}\t{hostname}"
        if spec.get("subdomain"):
            own += f"\t{hostname}.{spec['subdomain']}.{self.ns}.svc.{self.node.cluster_domain}"
        for alias in spec.get("hostAliases", []):
            own += f"\n{alias['ip']}\t{' '.join(alias.get('hostnames', []))}"
        self.hosts = self.dir / "etc-hosts"
        self.resolv = self.dir / "resolv.conf"
        domain = self.node.cluster_domain
        self.resolv.write_text(f"search {self.ns}.svc.{domain} svc.{domain} {domain}\noptions ndots:5\n")
        self.node.services.add_pod(self.uid, self.netns, self.ns, self.hosts, own)
        self._set_condition("PodReadyToStartContainers", "True")
        self._set_condition("Initialized", "False" if self.inits else "True",
                            "ContainersNotInitialized" if self.inits else "")
        self._set_condition("ContainersReady", "False", "ContainersNotReady")
        self._set_condition("Ready", "False", "ContainersNotReady")

    def _teardown_sandbox(self) -> None:
        if self.sandbox_down:
            return
        self.sandbox_down = True
        self.node.services.remove_pod(self.uid)
        if self.slot is not None:
            self.node.network.remove_pod(self.slot)
        volumes.remove(self.dir, self.memory_dirs)

    def _lookup(self, kind: str, name: str) -> dict | None:
        plural = {"Secret": "secrets", "ConfigMap": "configmaps"}[kind]
        try:
            return self.node.client.get(f"/api/v1/namespaces/{self.ns}/{plural}/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _token(self, sa: str, audiences: list[str], seconds: int) -> str:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": audiences, "expirationSeconds": seconds,
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                            "name": self.pod_name, "uid": self.uid}}}
        for attempt in range(20):  # the node authorizer learns of a new pod a moment later
            try:
                res = self.node.client.create(f"/api/v1/namespaces/{self.ns}/serviceaccounts/{sa}/token", body)
                return res["status"]["token"]
            except ApiError as exc:
                if exc.status != 403 or attempt == 19:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def _volumes_ready(self) -> bool:
        def shm(name: str) -> Path:
            path = self.node.names.shm_dir(self.uid, name)
            self.memory_dirs.append(path)
            return path

        try:
            self.volumes = volumes.prepare(self.latest(), self.dir, shm, self._lookup, self._token,
                                           self.node.allocatable)
            return True
        except (volumes.VolumeError, ApiError) as exc:
            msg = f"MountVolume.SetUp failed: {exc}"
            self.node.event(self.latest(), "FailedMount", msg, "Warning")
            for c in self.inits + self.containers:
                c.state = {"waiting": {"reason": "ContainerCreating", "message": msg}}
            return False

    # -- containers ----------------------------------------------------------------------
    def _step(self, c: Container) -> None:
        """Advance one container: start it, notice its exit, act on probes."""
        if c.done:
            return
        if c.run is None:
            if time.monotonic() >= c.next_start:
                self._start(c)
            return
        run = c.run
        code = run.proc.poll()
        if code is None:
            for kind in ("startupProbe", "livenessProbe"):
                prober = run.probers.get(kind)
                if prober is not None and prober.result is False and not run.kill_reason:
                    msg = f"{kind.replace('Probe', '').capitalize()} probe failed: {prober.message}"
                    self.node.event(self.latest(), "Unhealthy", msg, "Warning")
                    self.node.event(self.latest(), "Killing",
                                    f"Container {c.name} failed {kind.replace('Probe', '')} probe, will be restarted")
                    run.kill_reason = msg
                    threading.Thread(target=stop_run, args=(run, self._grace(c, prober.probe)),
                                     daemon=True).start()
                if kind == "startupProbe" and (prober is None or prober.result):
                    run.startup_ok.set()
            return
        self._reap(c, code)

    def _grace(self, c: Container, probe: dict | None = None) -> float:
        if probe and probe.get("terminationGracePeriodSeconds") is not None:
            return probe["terminationGracePeriodSeconds"]
        return self.pod["spec"].get("terminationGracePeriodSeconds", 30)

    def _start(self, c: Container) -> None:
        pod = self.latest()
        spec = c.spec
        services_env = self.node.services.service_env(self.ns)
        base = {**self.node.image_env, "PATH": self.node.path, "HOSTNAME": self.hostname, "HOME": "/root"}
        in_image = images.from_harness(spec.get("image", ""))
        if in_image:
            c.pull_failures += 1
            waiting = images.pull_failure(spec["image"], c.pull_failures)
            if waiting is not None:
                c.state = {"waiting": waiting}
                c.next_start = time.monotonic() + min(BACKOFF_MAX, 5 * 2 ** c.pull_failures)
                return
            c.pull_failures = 0
            base = {**images.image_env(spec["image"]), "HOSTNAME": self.hostname}
        try:
            env = envvars.resolve(self._view(pod), spec, self._lookup, base, services_env,
                                  self.node.allocatable)
        except (envvars.EnvError, ApiError) as exc:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            c.next_start = time.monotonic() + 2
            return
        unexpanded = images.container_argv(spec["image"], spec) if in_image else spec.get("command", []) + spec.get("args", [])
        argv = [envvars.expand(a, env) for a in unexpanded]
        cdir = self.dir / "containers" / f"{c.name}-{c.restarts}"
        pod_files = {"/etc/hosts": self.hosts, "/etc/resolv.conf": self.resolv}
        try:
            mounts = container_mounts(spec, env, cdir, pod_files, [] if in_image else self.node.tmp_keep, self.volumes)
        except volumes.VolumeError as exc:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            c.next_start = time.monotonic() + 2
            return
        cgroup = self.node.names.cgroup / f"{self.uid[:8]}-{c.name}-{c.restarts}"
        cgroup.mkdir(parents=True, exist_ok=True)
        launch_spec = {"hostname": self.hostname, "mounts": mounts, "cwd": spec.get("workingDir") or "/",
                       "masks": [{"dst": "/root", "keep": self.node.home_keep}], "argv": argv, "env": env}
        log_path = self.dir / "logs" / f"{c.name}-{c.restarts}.log"
        if in_image:
            try:
                proc, error = images.start(pod["spec"], spec, argv, env, mounts, self.netns, self.hostname, cgroup,
                                           cdir / "container.json", log_path), ""
            except ContainerConfigError as exc:
                c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
                c.next_start = time.monotonic() + 2
                return
        else:
            proc, error = launch(self.netns, cgroup, cdir / "launch.json", launch_spec, log_path)
        started = now_rfc3339()
        if error:
            self.log(f"container {c.name} failed to start: {error}")
            self.node.event(pod, "Failed", f"Error: {error}", "Warning")
            self._terminated(c, {"exitCode": 128, "reason": "StartError", "message": error,
                                 "startedAt": started, "finishedAt": now_rfc3339()})
            return
        run = Run(proc=proc, cgroup=cgroup, log=log_path, termlog=cdir / "termination-log", env=env,
                  started_at=started, t0=time.monotonic())
        c.run = run
        c.state = {"running": {"startedAt": started}}
        self.node.event(pod, "Started", f"Started container {c.name}")
        self.log(f"container {c.name} started (pid {proc.pid}): {shlex.join(argv)[:200]!r}")
        if not c.init:
            gate = None
            if spec.get("startupProbe"):
                run.probers["startupProbe"] = probes.Prober("startup", spec["startupProbe"], spec, self.pod_ip,
                                                            proc.pid, env)
                gate = run.startup_ok
            else:
                run.startup_ok.set()
            for kind in ("readinessProbe", "livenessProbe"):
                if spec.get(kind):
                    run.probers[kind] = probes.Prober(kind.replace("Probe", ""), spec[kind], spec, self.pod_ip,
                                                      proc.pid, env, gate)
            for prober in run.probers.values():
                prober.start()

    def _view(self, pod: dict) -> dict:
        """``pod`` with the addresses this node gave it (the API object may not show them yet)."""
        gw = self.node.network.gateway
        status = {**pod.get("status", {}), "podIP": self.pod_ip, "podIPs": [{"ip": self.pod_ip}],
                  "hostIP": gw, "hostIPs": [{"ip": gw}]}
        return {**pod, "status": status}

    def _reap(self, c: Container, code: int) -> None:
        run = c.run
        term = c.exited(code)
        why = f" ({run.kill_reason})" if run.kill_reason else ""
        self.log(f"container {c.name} exited {term['exitCode']}{why}")
        self._terminated(c, term, time.monotonic() - run.t0)

    def _terminated(self, c: Container, term: dict, ran: float = 0.0) -> None:
        restart = c.should_restart(term["exitCode"], self.pod["spec"].get("restartPolicy", "Always"))
        if not restart or self._interrupted():
            c.state = {"terminated": term}
            c.done = True
            return
        delay = c.schedule_restart(term, ran, self.node.backoff)
        if delay:
            msg = f"back-off {int(delay)}s restarting failed container={c.name} pod={self.pod_name}_{self.ns}"
            c.state = {"waiting": {"reason": "CrashLoopBackOff", "message": msg}}
            self.node.event(self.latest(), "BackOff", f"Back-off restarting failed container {c.name}", "Warning")
        else:
            c.state = {"waiting": {"reason": "ContainerCreating"}}

    def _kill_all(self, grace: float, reason: str = "") -> None:
        runs = [(c, c.run) for c in self.inits + self.containers if c.run is not None]
        if reason and runs:
            for c, _ in runs:
                self.node.event(self.latest(), "Killing", f"Stopping container {c.name}")
        threads = [threading.Thread(target=stop_run, args=(run, grace), daemon=True) for _, run in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c, run in runs:
            self._reap(c, run.proc.returncode)
        for c in self.inits + self.containers:
            if not c.done and c.last_state:  # was waiting to restart: it stays terminated
                c.state = dict(c.last_state)
            c.done = True  # one never started keeps its waiting state

    # -- status --------------------------------------------------------------------------
    def _set_condition(self, kind: str, status: str, reason: str = "", message: str = "") -> None:
        old = self.conditions.get(kind)
        if old and old["status"] == status and old.get("reason", "") == reason:
            return
        cond = {"type": kind, "status": status, "lastTransitionTime": now_rfc3339(), "lastProbeTime": None}
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        self.conditions[kind] = cond

    def _compute_phase(self) -> None:
        if self.phase not in ("Succeeded", "Failed"):  # terminal phases are final
            if any(c.done and c.exit_code for c in self.inits):
                self.phase = "Failed"
            elif all(c.done for c in self.containers):
                self.phase = "Succeeded" if all(c.exit_code == 0 for c in self.containers) else "Failed"
            elif any(c.run is not None or c.restarts or c.done for c in self.containers):
                self.phase = "Running"
            else:
                self.phase = "Pending"
        terminal_phase = self.phase in ("Succeeded", "Failed")
        ready = all(c.ready for c in self.containers) and not terminal_phase
        reason = "PodCompleted" if terminal_phase else "ContainersNotReady"
        self._set_condition("ContainersReady", "True" if ready else "False", "" if ready else reason)
        self._set_condition("Ready", "True" if ready else "False", "" if ready else reason)

    def _sync(self) -> None:
        """Patch the pod's status if it changed since the last patch."""
        self._compute_phase()
        status = {
            "phase": self.phase,
            "conditions": list(self.conditions.values()),
            "hostIP": self.node.network.gateway, "hostIPs": [{"ip": self.node.network.gateway}],
            "startTime": self.start_time,
            "initContainerStatuses": [c.status() for c in self.inits],
            "containerStatuses": [c.status() for c in self.containers],
        }
        if self.pod_ip:
            status["podIP"] = self.pod_ip
            status["podIPs"] = [{"ip": self.pod_ip}]
        text = json.dumps(status, sort_keys=True)
        if text == self._patched or self.gone.is_set():
            return
        try:
            self.node.client.patch(f"/api/v1/namespaces/{self.ns}/pods/{self.pod_name}/status",
                                   {"metadata": {"uid": self.uid}, "status": status}, strategic=True)
            self._patched = text
        except ApiError as exc:
            if exc.status == 404:
                self.gone.set()
            else:
                self.log(f"status patch failed: {exc}")
