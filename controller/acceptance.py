"""The review before a job may start: its spec parsed once, and what the CRD schema cannot check (pure functions).

A rejection is not a failure: the job stays `Accepted=False` with the reason, and the
operator looks again later (a Secret created afterwards lets the job proceed; the
spec can still be fixed because it becomes immutable only once accepted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from embedjob import api

# Schemes the driver reads through fsspec; a plain path is a file in the worker image
# or on a volume mounted into it.
SUPPORTED_SCHEMES = frozenset({"file", "s3", "gs", "gcs", "az", "abfs", "abfss", "http", "https"})
# The sample input the worker image ships (worker_image/Dockerfile copies it there).
SAMPLE_IN_WORKER_IMAGE = "/opt/embedjob/examples/pep-sample.jsonl"
# A pinned hub revision is a commit id; a branch or tag name can move under the job.
COMMIT_ID = re.compile(r"^[0-9a-f]{7,64}$")


@dataclass(frozen=True)
class Verdict:
    """The outcome of a review: accepted, or not with a CamelCase reason and a message."""

    accepted: bool
    reason: str
    message: str


ACCEPTED = Verdict(True, "RayJobCreated", "the RayJob was created")


def _reject(reason: str, message: str) -> Verdict:
    return Verdict(False, reason, message)


def check_source(uri: str) -> Verdict | None:
    """A URL of a supported scheme or an absolute path. A relative path is refused: the driver
    runs in a pod, where nothing says what it is relative to (`embedjob run` resolves it
    against the manifest's directory, which a cluster job does not have)."""
    scheme = urlsplit(uri).scheme.lower()
    if scheme and scheme not in SUPPORTED_SCHEMES:
        supported = ", ".join(sorted(SUPPORTED_SCHEMES))
        return _reject("UnsupportedSource",
                       f"spec.source.uri: scheme {scheme!r} is not supported ({supported}, or an absolute path)")
    path = uri.split(":", 1)[1].removeprefix("//") if scheme == "file" else uri
    if scheme in ("", "file") and not path.startswith("/"):
        return _reject(
            "RelativeSourcePath",
            f"spec.source.uri: {uri!r} is a relative path, which the driver's pod cannot resolve; give an "
            "absolute path in the worker image or on a volume mounted into the Ray pods (e.g. "
            f"{SAMPLE_IN_WORKER_IMAGE}, the sample the worker image ships), or a URL (s3://, gs://, https://...)",
        )
    return None


def check_model(model: api.Model) -> Verdict | None:
    if model.revision and not (model.path or model.package) and not COMMIT_ID.match(model.revision):
        return _reject(
            "ModelNotPinned",
            f"spec.model.revision {model.revision!r} is not a commit id (7-64 lowercase hex digits); "
            "a branch or tag can change while the job runs",
        )
    return None


def check_secret(sink: api.Sink, secret: dict[str, Any] | None) -> Verdict | None:
    ref = sink.database_secret_ref
    if secret is None:
        return _reject("SecretNotFound", f"Secret {ref.name!r} (spec.sink.databaseSecretRef.name) does not exist")
    if not (secret.get("data") or {}).get(ref.key):
        return _reject(
            "SecretKeyMissing", f"Secret {ref.name!r} has no non-empty key {ref.key!r} (spec.sink.databaseSecretRef.key)"
        )
    return None


def parse(spec: dict[str, Any]) -> api.EmbeddingJobSpec | Verdict:
    """The parsed spec, or an `InvalidSpec` rejection naming the fields."""
    try:
        return api.parse_spec(spec)
    except api.SpecError as exc:
        return _reject("InvalidSpec", str(exc))


def review(spec: api.EmbeddingJobSpec, secret: dict[str, Any] | None) -> Verdict:
    """Review a parsed spec and its database Secret (None: the Secret does not exist)."""
    return check_source(spec.source.uri) or check_model(spec.model) or check_secret(spec.sink, secret) or ACCEPTED
