"""Waiting for a condition: poll until it holds or a deadline passes."""

from __future__ import annotations

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
