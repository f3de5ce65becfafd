"""Why a finished RayJob did not succeed: the most specific reason, and where its driver's log is (pure)."""

from __future__ import annotations

import re
from typing import Any

from embedjob.contract import EXIT_REASONS, LOGS_HINT

from .rayjob import LABEL_JOB_NAME
from .run_reader import RunRow

MAX_MESSAGE = 1024
# The driver's exit code as KubeRay reports it in the RayJob's message
# ("Job entrypoint command failed with exit code 2, ...").
EXIT_CODE = re.compile(r"exit code (\d+)")


def shorten(text: str | None, limit: int = MAX_MESSAGE) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def failure(rayjob_status: dict[str, Any], run: RunRow | None) -> tuple[str, str]:
    """The most specific reason a finished RayJob did not succeed, and a message."""
    message = shorten(rayjob_status.get("message"))
    if run is not None and run.state == "failed" and run.reason:
        return run.reason, shorten(run.error) or message
    if rayjob_status.get("reason") in ("DeadlineExceeded", "PreRunningDeadlineExceeded"):
        return "DeadlineExceeded", message
    exit_code = EXIT_CODE.search(message)
    if exit_code and int(exit_code.group(1)) in EXIT_REASONS:
        return EXIT_REASONS[int(exit_code.group(1))], message
    if rayjob_status.get("jobStatus") == "STOPPED":
        return "RayJobStopped", message
    return "RayJobFailed", message or f"RayJob {rayjob_status.get('jobDeploymentStatus', '')}".strip()


def with_logs_hint(message: str, rayjob: dict[str, Any]) -> str:
    """A failed job's message, ending with where its driver's log is (whole, however long the message)."""
    meta = rayjob.get("metadata") or {}
    name = (meta.get("labels") or {}).get(LABEL_JOB_NAME)
    if not name:
        return message
    hint = LOGS_HINT.format(name=name, namespace=meta.get("namespace", "default"))
    return f"{shorten(message, MAX_MESSAGE - len(hint) - 2)}; {hint}" if message else hint
