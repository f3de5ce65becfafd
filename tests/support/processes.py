"""Child processes that serve a test session (etcd, the API server, Ray heads, operators).

Each runs in its own process group, logs to a file, and is killed with its group on
teardown, at interpreter exit, and (Linux, PR_SET_PDEATHSIG) when pytest itself dies.
`wait_for` waits until one is ready and fails early, with its log's tail, when it exits.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Sequence

from support.polling import wait_until

_CHILDREN: list[subprocess.Popen] = []


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def spawn(args: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen:
    """Start `args` in a process group of its own, stdout and stderr appended to `log_path`."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [str(a) for a in args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,  # own process group
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
    _CHILDREN.append(proc)
    return proc


def stop(proc: subprocess.Popen, timeout: float = 15, sig: int = signal.SIGTERM) -> None:
    """Send `sig` to the process group, wait up to `timeout`, then SIGKILL what is left of it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    # whatever is left of the group (the leader included) goes now
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    if proc in _CHILDREN:
        _CHILDREN.remove(proc)


@atexit.register
def _stop_all_children() -> None:
    for proc in list(reversed(_CHILDREN)):
        stop(proc, timeout=5)


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_for(what: str, check: Callable[[], Any], timeout: float, proc: subprocess.Popen | None = None,
             log: Path | None = None, interval: float = 0.2) -> None:
    """Poll `check` until it returns something truthy; an exception it raises counts as "not
    yet". Raises RuntimeError as soon as `proc` exits, TimeoutError at the deadline (both with
    the tail of `log`)."""
    errors: list[Exception] = []

    def ready() -> Any:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode}; log {log}:\n{tail(log) if log else ''}")
        try:
            return check()
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            errors.append(exc)
            return None

    try:
        wait_until(what, ready, timeout, interval)
    except AssertionError:
        last = errors[-1] if errors else None
        raise TimeoutError(f"{what}: not ready after {timeout}s (last error: {last!r}); log {log}:\n"
                           f"{tail(log) if log else ''}") from None


def http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    """Whether `url` answers 200 (an HTTP error status is a no; a refused connection raises)."""
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
            return resp.status == 200
    except urllib.error.HTTPError:
        return False


@contextmanager
def serving(what: str, args: Sequence[str], port: int, log_path: Path, env: dict[str, str] | None = None,
            timeout: float = 60, host: str = "127.0.0.1") -> Iterator[subprocess.Popen]:
    """`args` spawned (spawn) and waited for until it accepts connections on `host`:`port`; stopped at the end."""
    proc = spawn(args, log_path, env=env)
    try:
        wait_for(what, lambda: socket.create_connection((host, port), timeout=1).close() or True,
                 timeout=timeout, proc=proc, log=log_path)
        yield proc
    finally:
        stop(proc)
