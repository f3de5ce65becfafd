"""One pod on the test node, from its sandbox to its deletion (a thread per pod).

Sandbox (pod_sandbox.py): a network namespace with the pod's IP on the run's bridge, the
pod's /etc/hosts and /etc/resolv.conf (kept current by services.py), its volumes.
Init containers run one at a time, in order, each to success; then every container
starts (container_start.py; each one's process tree, exit record and restart back-off:
containers.py); restarts follow ``restartPolicy``. Probes: probes.py.

The status written back (strategic merge patch of pods/status; computed in pod_status.py)
carries phase, conditions (PodReadyToStartContainers, Initialized, ContainersReady, Ready),
pod and host IPs, startTime and a status per container (waiting/running/terminated with
exit code, reason, termination message, restartCount, lastState, ready, started).

Deletion: preStop is not run; SIGTERM to each container's main process, the pod's
grace period, SIGKILL to whatever is left in its cgroups, then the pod object is
deleted with grace 0 (UID precondition), as the kubelet does.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from typing import TYPE_CHECKING

from . import volumes
from .container_start import start_container
from .containers import Container, stop_run
from .kubeapi import ApiError, now_rfc3339
from .pod_sandbox import PodSandbox
from .pod_status import PodStatus

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
        self.sandbox = PodSandbox(node, pod, self.dir)
        self.status = PodStatus()
        spec = pod["spec"]
        self.inits = [Container(c, True) for c in spec.get("initContainers", [])]
        self.containers = [Container(c, False) for c in spec["containers"]]
        self._patched: str = ""

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
            self.sandbox.teardown()
            self.node.worker_done(self)

    def _deleting(self) -> bool:
        return bool(self.latest()["metadata"].get("deletionTimestamp"))

    def _run(self) -> None:
        if self._interrupted():  # deleted before it ever ran here
            return self._finish()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.status.start_time = now_rfc3339()
        self.status.set_condition("PodScheduled", "True")
        self.sandbox.create(self.log)
        self.status.set_condition("PodReadyToStartContainers", "True")
        self.status.set_condition("Initialized", "False" if self.inits else "True",
                                  "ContainersNotInitialized" if self.inits else "")
        self.status.set_condition("ContainersReady", "False", "ContainersNotReady")
        self.status.set_condition("Ready", "False", "ContainersNotReady")
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
                self.status.update_phase(self.inits, self.containers)
                if self.status.phase == "Failed":
                    break
                self._sync()
                time.sleep(POLL)
            if self.status.phase == "Failed":
                break
        if self.status.phase != "Failed":
            self.status.set_condition("Initialized", "True")
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
        self.sandbox.teardown()
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
    def _volumes_ready(self) -> bool:
        try:
            self.sandbox.prepare_volumes(self.latest())
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
                start_container(self, c)
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

    def _reap(self, c: Container, code: int) -> None:
        run = c.run
        term = c.exited(code)
        why = f" ({run.kill_reason})" if run.kill_reason else ""
        self.log(f"container {c.name} exited {term['exitCode']}{why}")
        self.terminated(c, term, time.monotonic() - run.t0)

    def terminated(self, c: Container, term: dict, ran: float = 0.0) -> None:
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
    def _sync(self) -> None:
        """Patch the pod's status if it changed since the last patch."""
        self.status.update_phase(self.inits, self.containers)
        status = self.status.body(self.inits, self.containers, self.node.network.gateway, self.sandbox.pod_ip)
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
