"""Structured logs (key=value lines) that never contain the database URL."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

_PASSWORD_IN_URL = re.compile(r"(://[^:/@\s]+:)[^@\s]+@")


def mask_url(url: str) -> str:
    """postgresql://user:secret@host/db -> postgresql://user:***@host/db"""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _quote(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname.lower(),
                  "logger": record.name, "event": record.getMessage()}
        fields.update(getattr(record, "fields", {}))
        line = " ".join(f"{k}={_quote(v)}" for k, v in fields.items())
        if record.exc_info:
            line += " exc=" + _quote(self.formatException(record.exc_info))
        return line


class SecretMaskingFilter(logging.Filter):
    """Defence in depth: masks the given secrets and any URL password in every record."""

    def __init__(self, secrets: list[str]):
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        fields = getattr(record, "fields", {})
        for secret in self.secrets:
            message = message.replace(secret, mask_url(secret))
        record.msg, record.args = _PASSWORD_IN_URL.sub(r"\1***@", message), ()
        record.fields = {k: _PASSWORD_IN_URL.sub(r"\1***@", str(v)) for k, v in fields.items()}
        return True


class LineHandler(logging.Handler):
    """Hands each formatted line to `write` (`embedjob run` prints it above its progress bar)."""

    def __init__(self, write: Callable[[str], None]):
        super().__init__()
        self.write = write

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.write(self.format(record))
        except Exception:  # noqa: BLE001 - logging's own policy: report, never raise into the caller
            self.handleError(record)


def configure_logging(secrets: list[str], level: int = logging.INFO,
                      write: Callable[[str], None] | None = None) -> None:
    """key=value lines with secrets masked, on stderr or through `write`."""
    handler = LineHandler(write) if write else logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    handler.addFilter(SecretMaskingFilter(secrets))
    root = logging.getLogger("embedjob_worker")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: object) -> None:
    logger.log(level, event, extra={"fields": fields})
