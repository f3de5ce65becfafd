"""An input or a model that cannot be read, as the job's failure: one line naming the URL and no credential.

The stores' filesystems fail in their own ways: s3fs and gcsfs raise OSError (PermissionError for a refused
credential), adlfs lets the Azure SDK's HttpResponseError through (401 or 403 for a refused key), gcsfs
google-auth's errors for a credential it could not use or refresh.
"""

from __future__ import annotations

from embedjob_worker.core.errors import JobFailed

# A store's refusal says no more than "Forbidden": say where to look.
_HINT = ("; the store refused this job's credentials or their access to the object (docs/sources.md says which "
         "variables are read)")


def in_a_store(uri: str) -> bool:
    """Whether `uri` names an object in a store (s3://, gs://, az://, https://, ...), not a local file."""
    return "://" in uri and not uri.startswith("file://")


def store_unavailable(reason: str, what: str, uri: str, exc: Exception) -> JobFailed:
    """The failure (`reason`) of a job whose `what` (e.g. `spec.source s3://...`) at `uri` could not be read with
    `exc`: its first line only (an SDK's error goes on with the response's body)."""
    detail = next(iter(str(exc).strip().splitlines()), "")
    hint = _HINT if in_a_store(uri) and _refused_credentials(exc) else ""
    return JobFailed(reason, f"{what}: {type(exc).__name__}: {detail}{hint}")


def _refused_credentials(exc: Exception) -> bool:
    return (isinstance(exc, PermissionError) or getattr(exc, "status_code", None) in (401, 403)
            or any(cls.__module__.startswith("google.auth") for cls in type(exc).__mro__))
