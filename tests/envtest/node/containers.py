"""One container on the test node: its process tree's start, exit record, restart back-off and stop.

A container is a process tree started as ``ip netns exec <pod netns> unshare --mount --uts
python launcher.py`` in a pids cgroup of its own (launcher.py joins it, mounts the
container's volumes and execs the command), so that whatever it starts can be found and
killed. Its state (waiting/running/terminated), ``lastState``, ``restartCount`` and the
kubelet's restart back-off (at once, then 10 s doubling, capped at 5 min) live here; the
pod around it (pods.py) decides when to start, stop and report it.
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
from dataclasses import dataclass, field
from pathlib import Path

from . import envvars, volumes
from .kubeapi import now_rfc3339
from .runs import kill_cgroup

LAUNCHER = Path(__file__).with_name("launcher.py")
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
        self.pull_failures = 0  # starts refused because the image is not there (ErrImagePull)
        self.run: Run | None = None
        self.state: dict = {"waiting": {"reason": "PodInitializing" if init else "ContainerCreating"}}
        self.last_state: dict = {}
        self.next_start = 0.0
        self.backoff = 0.0
        self.done = False  # terminated and will not run again

    @property
    def exit_code(self) -> int | None:
        return self.state.get("terminated", {}).get("exitCode")

    @property
    def ready(self) -> bool:
        run = self.run
        if run is None or not run.startup_ok.is_set():
            return False
        prober = run.probers.get("readinessProbe")
        return prober is None or prober.result is True

    def status(self) -> dict:
        """Its entry of the pod's ``containerStatuses`` / ``initContainerStatuses``."""
        run = self.run
        status = {"name": self.name, "image": self.spec.get("image", ""), "imageID": "",
                  "ready": self.ready, "restartCount": self.restarts, "state": self.state,
                  "lastState": self.last_state,
                  "started": bool(run is not None and run.startup_ok.is_set())}
        if run is not None:
            status["containerID"] = f"embedjob://{run.proc.pid}"
        elif "terminated" in self.state and "containerID" in self.state["terminated"]:
            status["containerID"] = self.state["terminated"]["containerID"]
        return status

    def exited(self, code: int) -> dict:
        """The terminated state of the run that exited with ``code`` (negative: killed by that
        signal); what it left behind is killed and ``run`` cleared."""
        run = self.run
        for prober in run.probers.values():
            prober.stop()
        kill_cgroup(run.cgroup)  # what the main process left behind
        exit_code = code if code >= 0 else 128 - code
        message = run.termlog.read_text(errors="replace")[:4096] if run.termlog.exists() else ""
        if not message and exit_code != 0 and self.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            lines = run.log.read_text(errors="replace").splitlines()[-80:]
            message = "\n".join(lines)[-2048:]
        reason = "Completed" if exit_code == 0 else "Error"
        term = {"exitCode": exit_code, "reason": reason, "startedAt": run.started_at, "finishedAt": now_rfc3339(),
                "containerID": f"embedjob://{run.proc.pid}"}
        if code < 0:
            term["signal"] = -code
        if message:
            term["message"] = message
        self.run = None
        return term

    def should_restart(self, code: int, policy: str) -> bool:
        if self.init:
            return code != 0 and policy != "Never"
        return policy == "Always" or (policy == "OnFailure" and code != 0)

    def schedule_restart(self, term: dict, ran: float, first_backoff: float) -> float:
        """Record ``term`` as the last state and plan the next start with the kubelet's back-off:
        at once, then ``first_backoff`` doubling to 5 min; a run of 10 min resets it. The delay."""
        if ran > 600:
            self.backoff = 0.0
        delay = self.backoff
        self.backoff = min(BACKOFF_MAX, self.backoff * 2 if self.backoff else first_backoff)
        self.next_start = time.monotonic() + delay
        self.last_state = {"terminated": term}
        self.restarts += 1
        return delay


def container_mounts(spec: dict, env: dict, cdir: Path, pod_files: dict[str, Path], tmp_keep: list[str],
                     pod_volumes: dict[str, Path]) -> list[dict]:
    """What launcher.py mounts for a container whose own files live in ``cdir``: the pod's files
    (``pod_files``: mount path -> file), its termination-message file, an /etc/profile that keeps
    its PATH, a private /tmp (unless a volume is mounted there) and its ``volumeMounts``.
    Raises volumes.VolumeError for a mount that cannot be made."""
    (cdir / "tmp").mkdir(parents=True, exist_ok=True)
    (cdir / "tmp").chmod(0o1777)
    termlog = cdir / "termination-log"
    termlog.touch()
    mounts = [{"src": str(src), "dst": dst} for dst, src in pod_files.items()]
    mounts.append({"src": str(termlog), "dst": spec.get("terminationMessagePath", "/dev/termination-log")})
    mounts += image_files(cdir, env["PATH"]) if "PATH" in env else []
    user_paths = {m["mountPath"].rstrip("/") for m in spec.get("volumeMounts", [])}
    if "/tmp" not in user_paths:
        mounts.append({"src": str(cdir / "tmp"), "dst": "/tmp"})
        # the image's parts that happen to live under /tmp on this machine stay visible
        mounts += [{"src": path, "dst": path, "readonly": True} for path in tmp_keep]
    for m in spec.get("volumeMounts", []):
        m = dict(m)
        if m.get("subPathExpr"):
            m["subPath"] = envvars.expand(m["subPathExpr"], env)
        mounts.append({"src": str(volumes.mount_source(pod_volumes, m)), "dst": m["mountPath"],
                       "readonly": bool(m.get("readOnly"))})
    return mounts


def image_files(cdir: Path, path: str) -> list[dict]:
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


def launch(netns: str, cgroup: Path, spec_path: Path, launch_spec: dict,
           log_path: Path) -> tuple[subprocess.Popen, str]:
    """Start launcher.py with ``launch_spec`` in ``netns`` and a new mount and UTS namespace, joined
    to ``cgroup``; (the process, the launcher's error before its exec — empty when it started)."""
    spec_path.write_text(json.dumps(launch_spec))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    rfd, wfd = os.pipe()
    cgfd = os.open(cgroup / "cgroup.procs", os.O_WRONLY)
    cmd = ["ip", "netns", "exec", netns, "unshare", "--mount", "--uts", "--propagation", "private",
           sys.executable, "-I", "-S", str(LAUNCHER), str(spec_path), str(wfd), str(cgfd)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                pass_fds=(wfd, cgfd), start_new_session=True,
                                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    os.close(wfd)
    os.close(cgfd)
    with os.fdopen(rfd, "rb") as r:
        error = r.read().decode(errors="replace")  # EOF at the exec: empty means started
    if error:
        proc.wait()
        kill_cgroup(cgroup)
    return proc, error


def stop_run(run: Run, grace: float) -> None:
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
