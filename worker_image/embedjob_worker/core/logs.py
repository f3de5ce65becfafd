"""Structured logs (key=value lines) that never contain a database password, and the masking of error texts."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from urllib.parse import unquote, urlsplit, urlunsplit

_MASK = "***"
# The connection parameters that hold a password (libpq's keywords), in a URL's query or a key=value DSN.
_PASSWORD_KEYS = ("password", "sslpassword")
# Any URL's userinfo password, up to the netloc's last `@` (a password may hold an unescaped `@`).
_PASSWORD_IN_URL = re.compile(r"(://[^:/@\s]+:)[^/\s]*@")
# `password=...` or `sslpassword=...` in a URL's query or a libpq key=value DSN (quoted or not).
_PASSWORD_PARAM = re.compile(r"(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]+)", re.IGNORECASE)
# What configure_logging was told to keep secret: mask_secrets masks these in error texts too.
_registered_secrets: list[str] = []
# The object stores' filesystems and SDKs, whose loggers would otherwise print through logging's last resort.
_STORE_LOGGERS = ("fsspec", "s3fs", "gcsfs", "adlfs", "azure")


def mask_url(url: str) -> str:
    """A database URL (or libpq key=value DSN) with every password masked, found by parsing: the
    userinfo's (postgresql://user:***@host/db) and the query's password and sslpassword."""
    if "://" not in url:
        return _PASSWORD_PARAM.sub(rf"\1{_MASK}", url)
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostinfo = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}:{_MASK}@{hostinfo}"
    query = "&".join(f"{key}={_MASK}" if key.lower() in _PASSWORD_KEYS else param
                     for param in parts.query.split("&") for key in [param.partition("=")[0]]) if parts.query else ""
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def url_passwords(url: str) -> list[str]:
    """The passwords in a database URL as written and decoded (userinfo, query), and each part of one that
    follows an unescaped `@`, which libpq reads as part of the host (and prints in its errors)."""
    if "://" not in url:
        return [value.strip("'") for _, value in _PASSWORD_PARAM.findall(url)]
    parts = urlsplit(url)
    found = [parts.password] if parts.password else []
    found += [param.partition("=")[2] for param in parts.query.split("&")
              if param.partition("=")[0].lower() in _PASSWORD_KEYS]
    found += [unquote(password) for password in found]
    found += [password.split("@", cut)[-1] + "@"
              for password in list(found) for cut in range(1, password.count("@") + 1)]
    return [password for password in found if password]


def mask_text(text: str, secrets: list[str]) -> str:
    """`text` with each secret URL masked (mask_url), each of their passwords (url_passwords) replaced, and any
    other URL or DSN password masked."""
    replacements = {secret: mask_url(secret) for secret in secrets if secret}
    for secret in secrets:
        replacements |= {password: f"{_MASK}@" if password.endswith("@") else _MASK
                         for password in url_passwords(secret or "")}
    for clear in sorted(replacements, key=len, reverse=True):  # a whole URL before the passwords in it
        text = text.replace(clear, replacements[clear])
    return _PASSWORD_PARAM.sub(rf"\1{_MASK}", _PASSWORD_IN_URL.sub(rf"\1{_MASK}@", text))


def mask_secrets(text: str) -> str:
    """`text` masked (mask_text) for the secrets configure_logging was given: for an error text before it is
    printed or stored."""
    return mask_text(text, _registered_secrets)


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
        if record.exc_info or record.exc_text:  # exc_text: masked by SecretMaskingFilter
            line += " exc=" + _quote(record.exc_text or self.formatException(record.exc_info))
        return line


class SecretMaskingFilter(logging.Filter):
    """Masks the given secrets and any URL or DSN password (mask_text) in every record, its traceback too."""

    def __init__(self, secrets: list[str]):
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = mask_text(record.getMessage(), self.secrets), ()
        record.fields = {k: mask_text(str(v), self.secrets) for k, v in getattr(record, "fields", {}).items()}
        if record.exc_info:  # an exception's text may hold the URL: formatted and masked here, once
            record.exc_text = mask_text(logging.Formatter().formatException(record.exc_info), self.secrets)
            record.exc_info = None
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


class _WithoutTraceback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        return True


def configure_logging(secrets: list[str], level: int = logging.INFO,
                      write: Callable[[str], None] | None = None, names: tuple[str, ...] = ("embedjob_worker",)) -> None:
    """key=value lines with secrets masked, on stderr or through `write`: the driver's (and those of the other
    loggers `names`), and the warnings of the object stores' libraries without their tracebacks (gcsfs logs one
    with every failed request; the error reaches the driver, which reports it)."""
    _registered_secrets[:] = [secret for secret in secrets if secret]
    for name, extra_filters, name_level in [(name, [], level) for name in names] + [
            (store, [_WithoutTraceback()], logging.WARNING) for store in _STORE_LOGGERS]:
        handler = LineHandler(write) if write else logging.StreamHandler(sys.stderr)
        handler.setFormatter(KeyValueFormatter())
        for log_filter in (*extra_filters, SecretMaskingFilter(secrets)):
            handler.addFilter(log_filter)
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(name_level)
        logger.propagate = False


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: object) -> None:
    logger.log(level, event, extra={"fields": fields})
