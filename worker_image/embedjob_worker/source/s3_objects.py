"""Whole S3 objects fetched by obstore (Rust, off the GIL), signed with the credentials botocore finds.

A dataset's parts are fetched whole while the part before them is parsed (files.read_dataset). Through
s3fs (aiohttp, botocore's Python signing, a HEAD for the ETag then a GET) a 640 KB Parquet part cost the
reader's process about as much CPU as parsing it; obstore's one GET with `If-Match: <the listed ETag>`
costs a tenth of that (bench/object_store_read.py), so the parser keeps its core.

Everything but the transfer stays botocore's, so a job reads S3 exactly as it did through s3fs: the
credentials (its whole chain: the AWS environment, IRSA's web identity, the shared files, container and
instance roles, refreshed as they expire), the endpoint (`AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`) and the
region. An answer that is not the object (another ETag, gone, a refusal, a redirect to the bucket's region)
returns None: the caller reads the part through fsspec as before, which says what happened in the same words
as ever. A bucket whose request failed for any other reason than a change is left to fsspec for the rest of
the process (logged once), so a store obstore cannot talk to costs one request, not one per part.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

from embedjob_worker.core.logs import log_event
from embedjob_worker.source.snapshot import InputSnapshot

log = logging.getLogger("embedjob_worker.source.s3_objects")

# How long obstore keeps the credentials it was given before it asks again (botocore refreshes its own).
_CREDENTIALS_KEPT = timedelta(minutes=5)
_lock = threading.Lock()
_stores: dict[tuple, Any] = {}  # (bucket, the AWS_* environment) -> its obstore S3Store, or None: left to fsspec


class BotocoreCredentials:
    """obstore's credential provider: the credentials botocore's chain finds, as of each call."""

    def __init__(self, session) -> None:
        self._session = session

    def __call__(self) -> dict[str, Any]:
        found = self._session.get_credentials()
        if found is None:
            raise PermissionError("botocore found no AWS credentials")
        frozen = found.get_frozen_credentials()  # refreshed first when they are about to expire
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key, "token": frozen.token,
                "expires_at": datetime.now(timezone.utc) + _CREDENTIALS_KEPT}


def s3_store(bucket: str):
    """The bucket's obstore S3Store at botocore's endpoint and region, or None when botocore finds no
    credentials (an anonymous read stays s3fs's) or the bucket was given up on."""
    key = (bucket, tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))))
    with _lock:
        if key not in _stores:
            _stores[key] = _new_store(bucket)
        return _stores[key]


def _new_store(bucket: str):
    import botocore.session
    from obstore.store import S3Store

    session = botocore.session.get_session()
    if session.get_credentials() is None:
        return None
    client = session.create_client("s3")  # resolves the endpoint and region as s3fs's client does
    endpoint, region = client.meta.endpoint_url, client.meta.region_name or "us-east-1"
    return S3Store(bucket, endpoint=endpoint, region=region, credential_provider=BotocoreCredentials(session),
                   client_options={"allow_http": endpoint.startswith("http://")})


def fetched_object(part: InputSnapshot):
    """The bytes of the S3 object of `part` (a buffer) when it is still the object the run listed (its ETag,
    sent as If-Match, and its size); None when they could not be fetched so: the caller then reads it through
    fsspec, which names a change in the same words as ever."""
    bucket, _, key = part.uri.removeprefix("s3://").partition("/")
    kind, _, etag = part.content.partition(":")
    if kind != "ETag" or not key:
        return None
    import obstore
    from obstore.exceptions import NotFoundError, PreconditionError

    try:
        store = s3_store(bucket)
        if store is None:
            return None
        data = obstore.get(store, key, options={"if_match": etag}).bytes()
    except (PreconditionError, NotFoundError):
        return None  # changed or gone since the listing
    except Exception as exc:  # noqa: BLE001 - whatever obstore could not do (a region's redirect, ...), s3fs does
        with _lock:
            _stores.update({k: None for k in _stores if k[0] == bucket})
        log_event(log, "s3_objects_through_fsspec", logging.WARNING, bucket=bucket,
                  error=f"{type(exc).__name__}: {str(exc)[:200]}")
        return None
    return data if len(data) == part.size else None
