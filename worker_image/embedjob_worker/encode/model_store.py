"""A model from storage (spec.model.uri): fetched once per node into a local cache and verified against its revision.

A remote model directory (s3://, gs://, az://, ... through fsspec) is copied into the
node's cache, `embedjob-models` under the system's temp folder (`/tmp/embedjob-models` in
a Ray pod: mount a volume there to give it room; `$EMBEDJOB_MODEL_CACHE` elsewhere, e.g.
for `embedjob run`), one folder per (uri, revision). The first process on a node to need it downloads it under an
exclusive file lock into a temporary folder, hashes its weights as a path model's are
hashed (`weights_revision`) and renames the folder into place only when the hash is
the spec's revision; the others wait on the lock and find it there. So N actors of a node
download it once, a half-written or mismatched copy is never loaded, and a later job with
the same model on the same node downloads nothing. A local directory (a mounted volume) is
used where it lies, verified the same way.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import fsspec
from fsspec.implementations.local import LocalFileSystem

MODEL_CACHE_ENV = "EMBEDJOB_MODEL_CACHE"
_COMPLETE = ".embedjob-verified"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".onnx")
REVISION_HEX_CHARS = 16


def model_cache() -> Path:
    return Path(os.environ.get(MODEL_CACHE_ENV) or Path(tempfile.gettempdir()) / "embedjob-models")


def fetch_model(uri: str, revision: str) -> Path:
    """The local directory of the model at `uri`, whose weights hash (`weights_revision`) to `revision`;
    FileNotFoundError when there is nothing there, ValueError naming both revisions when they differ."""
    fs, path = fsspec.core.url_to_fs(uri)
    if isinstance(fs, LocalFileSystem):
        _verify(Path(path), uri, revision)
        return Path(path)
    cache = model_cache()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"{hashlib.sha256(uri.rstrip('/').encode()).hexdigest()[:16]}-{revision}"
    if (target / _COMPLETE).exists():
        return target
    with open(cache / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the node's other actors wait here while one downloads
        if (target / _COMPLETE).exists():
            return target
        if not fs.isdir(path):
            raise FileNotFoundError(f"no model directory at {uri}")
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache))
        try:
            fs.get(path.rstrip("/") + "/", str(staging) + "/", recursive=True)
            _verify(staging, uri, revision)
            (staging / _COMPLETE).touch()
            shutil.rmtree(target, ignore_errors=True)  # a copy from before a crash, never marked verified
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _verify(directory: Path, uri: str, revision: str) -> None:
    found = weights_revision(directory)
    if found != revision:
        raise ValueError(f"the weights at {uri} hash to revision {found}, not spec.model.revision {revision}: "
                         "another model, or files changed since the revision was taken")


def weights_revision(directory: str | Path) -> str:
    """sha256 over the weight files (relative name + content), truncated: the path/package revision."""
    directory = Path(directory)
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"no weight files ({', '.join(_WEIGHT_SUFFIXES)}) under {directory}")
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(directory)).encode() + b"\x00")
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:REVISION_HEX_CHARS]
