"""One pod on the test node, from its sandbox to its deletion (a thread per pod).

Sandbox: a network namespace with the pod's IP on the run's bridge, the pod's
/etc/hosts and /etc/resolv.conf (kept current by services.py), its volumes.
Init containers run one at a time, in order, each to success; then every container
starts. A container is a process tree in its own mount and UTS namespace and its own
pids cgroup (launcher.py); when its main process exits, whatever it left running is
killed, as a PID namespace would. Restarts follow ``restartPolicy`` with the kubelet's
back-off (10 s doubling, capped at 5 min). Probes: probes.py.

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
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import envvars, probes, volumes
from .kubeapi import ApiError, now_rfc3339
from .runs import kill_cgroup

if TYPE_CHECKING:
    from .agent import Node

LAUNCHER = Path(__file__).with_name("launcher.py")
POLL = 0.2
BACKOFF_MAX = 300.0


@dataclass
class Run:
    """One execution of a container."""

    proc: subprocess.Popen
    cgroup: Path
    log: Path
    termlog: Path
    env: dict
    started_at: str
    t0: float
    probers: dict = field(default_factory=dict)
    startup_ok: threading.Event = field(default_factory=threading.Event)
    kill_reason: str = ""


class Container:
    def __init__(self, spec: dict, init: bool):
        self.spec, self.init, self.name = spec, init, spec["name"]
        self.restarts = 0
        self.run: Run | None = None
        self.state: dict = {"waiting": {"reason": "PodInitializing" if init else "ContainerCreating"}}
        self.last_state: dict = {}
        self.next_start = 0.0
        self.backoff = 0.0
        self.done = False  # terminated and will not run again

    @property
    def exit_code(self) -> int | None:
        return self.state.get("terminated", {}).get("exitCode")


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
                    threading.Thread(target=self._stop_run, args=(run, self._grace(c, prober.probe)),
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
        try:
            env = envvars.resolve(self._view(pod), spec, self._lookup, base, services_env,
                                  self.node.allocatable)
        except (envvars.EnvError, ApiError) as exc:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            c.next_start = time.monotonic() + 2
            return
        argv = [envvars.expand(a, env) for a in spec.get("command", []) + spec.get("args", [])]
        cdir = self.dir / "containers" / f"{c.name}-{c.restarts}"
        (cdir / "tmp").mkdir(parents=True, exist_ok=True)
        (cdir / "tmp").chmod(0o1777)
        termlog = cdir / "termination-log"
        termlog.touch()
        mounts = [{"src": str(self.hosts), "dst": "/etc/hosts"},
                  {"src": str(self.resolv), "dst": "/etc/resolv.conf"},
                  {"src": str(termlog), "dst": spec.get("terminationMessagePath", "/dev/termination-log")}]
        mounts += self._image_files(cdir, env["PATH"]) if "PATH" in env else []
        user_paths = {m["mountPath"].rstrip("/") for m in spec.get("volumeMounts", [])}
        if "/tmp" not in user_paths:
            mounts.append({"src": str(cdir / "tmp"), "dst": "/tmp"})
            # the image's parts that happen to live under /tmp on this machine stay visible
            mounts += [{"src": path, "dst": path, "readonly": True} for path in self.node.tmp_keep]
        try:
            for m in spec.get("volumeMounts", []):
                m = dict(m)
                if m.get("subPathExpr"):
                    m["subPath"] = envvars.expand(m["subPathExpr"], env)
                mounts.append({"src": str(volumes.mount_source(self.volumes, m)), "dst": m["mountPath"],
                               "readonly": bool(m.get("readOnly"))})
        except volumes.VolumeError as exc:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            c.next_start = time.monotonic() + 2
            return
        cgroup = self.node.names.cgroup / f"{self.uid[:8]}-{c.name}-{c.restarts}"
        cgroup.mkdir(parents=True, exist_ok=True)
        launch = {"hostname": self.hostname, "mounts": mounts,
                  "cwd": spec.get("workingDir") or "/",
                  "masks": [{"dst": "/root", "keep": self.node.home_keep}], "argv": argv, "env": env}
        spec_path = cdir / "launch.json"
        spec_path.write_text(json.dumps(launch))
        log_path = self.dir / "logs" / f"{c.name}-{c.restarts}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        rfd, wfd = os.pipe()
        cgfd = os.open(cgroup / "cgroup.procs", os.O_WRONLY)
        cmd = ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--uts", "--propagation", "private",
               sys.executable, "-I", "-S", str(LAUNCHER), str(spec_path), str(wfd), str(cgfd)]
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    pass_fds=(wfd, cgfd), start_new_session=True,
                                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        os.close(wfd)
        os.close(cgfd)
        with os.fdopen(rfd, "rb") as r:
            error = r.read().decode(errors="replace")  # EOF at the exec: empty means started
        started = now_rfc3339()
        if error:
            proc.wait()
            kill_cgroup(cgroup)
            self.log(f"container {c.name} failed to start: {error}")
            self.node.event(pod, "Failed", f"Error: {error}", "Warning")
            self._terminated(c, {"exitCode": 128, "reason": "StartError", "message": error,
                                 "startedAt": started, "finishedAt": now_rfc3339()})
            return
        run = Run(proc=proc, cgroup=cgroup, log=log_path, termlog=termlog, env=env, started_at=started,
                  t0=time.monotonic())
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

    @staticmethod
    def _image_files(cdir: Path, path: str) -> list[dict]:
        """An /etc/profile that keeps the container's PATH, as an image's ENV PATH survives ``bash -l``
        (Debian's /etc/profile resets PATH)."""
        mounts = []
        host_profile = Path("/etc/profile")
        if host_profile.is_file():
            profile = cdir / "etc-profile"
            profile.write_text(host_profile.read_text() + "\n# embedjob test node: the container's PATH\n"
                               f"export PATH={shlex.quote(path)}\n")
            mounts.append({"src": str(profile), "dst": "/etc/profile"})
        return mounts

    def _view(self, pod: dict) -> dict:
        """``pod`` with the addresses this node gave it (the API object may not show them yet)."""
        gw = self.node.network.gateway
        status = {**pod.get("status", {}), "podIP": self.pod_ip, "podIPs": [{"ip": self.pod_ip}],
                  "hostIP": gw, "hostIPs": [{"ip": gw}]}
        return {**pod, "status": status}

    def _reap(self, c: Container, code: int) -> None:
        run = c.run
        for prober in run.probers.values():
            prober.stop()
        kill_cgroup(run.cgroup)  # what the main process left behind
        exit_code = code if code >= 0 else 128 - code
        message = run.termlog.read_text(errors="replace")[:4096] if run.termlog.exists() else ""
        if not message and exit_code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            lines = run.log.read_text(errors="replace").splitlines()[-80:]
            message = "\n".join(lines)[-2048:]
        reason = "Completed" if exit_code == 0 else "Error"
        term = {"exitCode": exit_code, "reason": reason, "startedAt": run.started_at, "finishedAt": now_rfc3339(),
                "containerID": f"embedjob://{run.proc.pid}"}
        if code < 0:
            term["signal"] = -code
        if message:
            term["message"] = message
        ran = time.monotonic() - run.t0
        c.run = None
        self.log(f"container {c.name} exited {exit_code}{' (' + run.kill_reason + ')' if run.kill_reason else ''}")
        self._terminated(c, term, ran)

    def _terminated(self, c: Container, term: dict, ran: float = 0.0) -> None:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        code = term["exitCode"]
        if c.init:
            restart = code != 0 and policy != "Never"
        else:
            restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        if self._interrupted():
            restart = False
        if not restart:
            c.state = {"terminated": term}
            c.done = True
            return
        # restart with the kubelet's back-off: at once, then 10 s, 20 s, ... 5 min; a run of 10 min resets it
        if ran > 600:
            c.backoff = 0.0
        delay = c.backoff
        c.backoff = min(BACKOFF_MAX, c.backoff * 2 if c.backoff else self.node.backoff)
        c.next_start = time.monotonic() + delay
        c.last_state = {"terminated": term}
        c.restarts += 1
        if delay:
            msg = f"back-off {int(delay)}s restarting failed container={c.name} pod={self.pod_name}_{self.ns}"
            c.state = {"waiting": {"reason": "CrashLoopBackOff", "message": msg}}
            self.node.event(self.latest(), "BackOff", f"Back-off restarting failed container {c.name}", "Warning")
        else:
            c.state = {"waiting": {"reason": "ContainerCreating"}}

    def _stop_run(self, run: Run, grace: float) -> None:
        """SIGTERM the container's main process; SIGKILL everything in its cgroup after ``grace``."""
        try:
            os.kill(run.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            run.proc.wait(timeout=max(0.0, grace))
        except subprocess.TimeoutExpired:
            pass
        kill_cgroup(run.cgroup)
        run.proc.wait()

    def _kill_all(self, grace: float, reason: str = "") -> None:
        runs = [(c, c.run) for c in self.inits + self.containers if c.run is not None]
        if reason and runs:
            for c, _ in runs:
                self.node.event(self.latest(), "Killing", f"Stopping container {c.name}")
        threads = [threading.Thread(target=self._stop_run, args=(run, grace), daemon=True) for _, run in runs]
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
        ready = all(self._ready(c) for c in self.containers) and not terminal_phase
        reason = "PodCompleted" if terminal_phase else "ContainersNotReady"
        self._set_condition("ContainersReady", "True" if ready else "False", "" if ready else reason)
        self._set_condition("Ready", "True" if ready else "False", "" if ready else reason)

    @staticmethod
    def _ready(c: Container) -> bool:
        run = c.run
        if run is None or not run.startup_ok.is_set():
            return False
        prober = run.probers.get("readinessProbe")
        return prober is None or prober.result is True

    def _container_status(self, c: Container) -> dict:
        run = c.run
        status = {"name": c.name, "image": c.spec.get("image", ""), "imageID": "",
                  "ready": self._ready(c), "restartCount": c.restarts, "state": c.state,
                  "lastState": c.last_state,
                  "started": bool(run is not None and run.startup_ok.is_set())}
        if run is not None:
            status["containerID"] = f"embedjob://{run.proc.pid}"
        elif "terminated" in c.state and "containerID" in c.state["terminated"]:
            status["containerID"] = c.state["terminated"]["containerID"]
        return status

    def _sync(self) -> None:
        """Patch the pod's status if it changed since the last patch."""
        self._compute_phase()
        status = {
            "phase": self.phase,
            "conditions": list(self.conditions.values()),
            "hostIP": self.node.network.gateway, "hostIPs": [{"ip": self.node.network.gateway}],
            "startTime": self.start_time,
            "initContainerStatuses": [self._container_status(c) for c in self.inits],
            "containerStatuses": [self._container_status(c) for c in self.containers],
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
