"""Waiting for a condition: poll until it holds or a deadline passes."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable


def wait_until(what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.25) -> Any:
    """Poll `check` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


class BackgroundPoller:
    """Calls `poll()` about every second on a thread of its own while used as a context manager
    (so a state that lasts between a test's own looks is seen too)."""

    def __init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(1)

    def poll(self) -> None:
        raise NotImplementedError
