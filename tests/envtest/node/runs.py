"""Names of one agent run's host resources, its liveness record, and the removal of leftovers.

Everything a run creates on the host carries the prefix ``ejn<RUNID>`` (RUNID: 6 hex
digits), short enough for Linux interface names (15 characters):

    bridge          ejn<RUNID>                     (the node's address, the pods' gateway)
    veth (host end) ejn<RUNID>v<SLOT>               (removed with the pod's network namespace)
    netns           ejn<RUNID>-<SLOT>               (/run/netns/...)
    cgroup          /sys/fs/cgroup/pids/ejn<RUNID>/ (one child per container run)
    memory volumes  /dev/shm/ejn<RUNID>-...         (emptyDir medium: Memory)
    state           /run/embedjob-node/ejn<RUNID>/  (agent pid + start time)

A run is alive while the process recorded in its state directory is. ``sweep()``
removes every ``ejn*`` resource whose run is not alive; the agent runs it at start-up
under a host-wide lock, and the reaper runs ``remove_run`` when its agent dies.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

PREFIX = "ejn"
STATE_ROOT = Path("/run/embedjob-node")
CGROUP_ROOT = Path("/sys/fs/cgroup/pids")
SHM_ROOT = Path("/dev/shm")
RUN_RE = re.compile(rf"^{PREFIX}([0-9a-f]{{6}})")


def new_run_id() -> str:
    return uuid.uuid4().hex[:6]


class RunNames:
    def __init__(self, run_id: str):
        self.run_id = run_id
        self.tag = f"{PREFIX}{run_id}"
        self.bridge = self.tag
        self.state_dir = STATE_ROOT / self.tag
        self.cgroup = CGROUP_ROOT / self.tag

    def veth(self, slot: int) -> str:
        return f"{self.tag}v{slot}"

    def netns(self, slot: int) -> str:
        return f"{self.tag}-{slot}"

    def shm_dir(self, pod_uid: str, volume: str) -> Path:
        return SHM_ROOT / f"{self.tag}-{pod_uid[:8]}-{volume}"


@contextmanager
def host_lock():
    """Serialise start-up sweeps and address allocation between runs on this machine."""
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    with open(STATE_ROOT / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22: start time in clock ticks


def record_alive(names: RunNames, pid: int, **extra) -> None:
    names.state_dir.mkdir(parents=True, exist_ok=True)
    (names.state_dir / "agent.json").write_text(json.dumps({"pid": pid, "start": _start_time(pid), **extra}))


def read_state(names: RunNames) -> dict:
    try:
        return json.loads((names.state_dir / "agent.json").read_text())
    except (OSError, ValueError):
        return {}


def is_alive(names: RunNames) -> bool:
    state = read_state(names)
    return bool(state) and _start_time(state["pid"]) == state.get("start")


def _sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True)


def _links() -> list[str]:
    out = _sh("ip", "-o", "link", "show").stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def _netns() -> list[str]:
    return _sh("ip", "netns", "list").stdout.split()


def existing_run_ids() -> set[str]:
    """Run ids that own anything on this machine."""
    names = _links() + _netns()
    for root in (STATE_ROOT, CGROUP_ROOT, SHM_ROOT):
        try:
            names += os.listdir(root)
        except OSError:
            pass
    return {m.group(1) for n in names if (m := RUN_RE.match(n))}


def leftovers(names: RunNames) -> dict[str, list]:
    """What run ``names`` owns on this machine now: {"cgroup", "netns", "link", "dir"}."""
    return {
        "cgroup": [names.cgroup] if names.cgroup.exists() else [],
        "netns": [n for n in _netns() if n.startswith(names.tag + "-")],
        "link": [n for n in _links() if n.startswith(names.tag)],
        "dir": [*SHM_ROOT.glob(f"{names.tag}-*"), *([names.state_dir] if names.state_dir.exists() else [])],
    }


def kill_cgroup(cgroup: Path, sig: int = signal.SIGKILL, attempts: int = 50) -> None:
    """Signal every process in ``cgroup`` and its children; with SIGKILL, until none is left, then remove them."""
    if not cgroup.is_dir():
        return
    for _ in range(attempts):
        pids = []
        for procs in cgroup.rglob("cgroup.procs"):
            try:
                pids += [int(p) for p in procs.read_text().split()]
            except OSError:
                pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if sig != signal.SIGKILL or not pids:
            break
        time.sleep(0.1)
    if sig == signal.SIGKILL:
        for sub in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                sub.rmdir()
            except OSError:
                pass
        try:
            cgroup.rmdir()
        except OSError:
            pass


def remove_run(names: RunNames) -> list[str]:
    """Remove everything of run ``names`` from this machine (processes first); returns what was removed."""
    owned = leftovers(names)
    kill_cgroup(names.cgroup)
    for ns in owned["netns"]:
        _sh("ip", "netns", "delete", ns)  # takes the pod's end of its veth pair along
    for link in owned["link"]:
        _sh("ip", "link", "delete", link)
    for path in owned["dir"]:
        shutil.rmtree(path, ignore_errors=True)
    return [f"{kind} {item}" for kind, items in owned.items() for item in items]


def sweep(exclude: str | None = None) -> dict[str, list[str]]:
    """Remove the leftovers of every run whose agent is gone (call under :func:`host_lock`)."""
    done = {}
    for run_id in existing_run_ids():
        names = RunNames(run_id)
        if run_id != exclude and not is_alive(names):
            done[run_id] = remove_run(names)
    return done
