"""The model tokenizer's Rust half kept on disk, so that a driver's next start loads it without transformers.

transformers builds a model's fast tokenizer from its files and its own rules (tokenizer_config.json's
settings applied over tokenizer.json, or a tokenizer made from vocab.txt), and importing it
imports torch: about 5 s of CPU before a token-budget or chunking job plans its first batch
(bench/startup.py). What the driver counts with is the built `tokenizers.Tokenizer` and the
tokenizer's model_max_length; both are kept here once transformers built them, under a key of
everything that went into the build: the bytes of every file in the tokenizer's folder (weights
left out) and the transformers and tokenizers versions. Another file, or another version of
either library, is another key. Only local folders are kept (a hub id's files are the hub
cache's), and a cache that cannot be written or read is no cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import suppress
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

from embedjob_worker.encode.exported import cache_root

# Files of a model folder that never shape its tokenizer: the weights, often gigabytes.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".onnx", ".h5", ".msgpack", ".ckpt", ".gguf")


@dataclass(frozen=True)
class KeptTokenizer:
    """What the driver uses of a transformers fast tokenizer, read back from the cache."""

    backend_tokenizer: Any  # tokenizers.Tokenizer
    model_max_length: int
    is_fast: ClassVar[bool] = True  # a kept tokenizer is always a fast one's Rust half


def tokenizer_key(folder: Path, hub_revision: str | None) -> str | None:
    """The cache key of the tokenizer transformers builds from `folder`; None when it is not a local folder."""
    if not folder.is_dir():
        return None
    digest = hashlib.sha256(json.dumps([metadata.version("transformers"), metadata.version("tokenizers"),
                                        hub_revision]).encode())
    for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.endswith(_WEIGHT_SUFFIXES)):
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:32]


def tokenizer_entry(location: str, hub_revision: str | None) -> Path | None:
    """The cache file of the tokenizer transformers builds from the folder `location`; None when it has none
    (not a local folder, or a folder that cannot be read)."""
    try:
        key = tokenizer_key(Path(location), hub_revision)
    except OSError:
        return None
    return None if key is None else cache_root() / "tokenizers" / f"{key}.json"


def kept_tokenizer(entry: Path) -> KeptTokenizer | None:
    """The tokenizer kept in the cache file `entry` (tokenizer_entry), or None (not kept, unreadable)."""
    from tokenizers import Tokenizer

    try:
        kept = json.loads(entry.read_text())
        return KeptTokenizer(Tokenizer.from_str(kept["tokenizer"]), int(kept["model_max_length"]))
    except Exception:  # noqa: BLE001 - tokenizers raises plain Exceptions; a bad entry is a miss, never a failure
        return None


def keep_tokenizer(entry: Path, tokenizer: Any) -> None:
    """Keep a transformers tokenizer's Rust half in the cache file `entry` (a slow tokenizer has none: not kept)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False):
        return
    # Written whole, then renamed: a driver starting beside this one reads no entry or the whole of one.
    written = entry.with_name(f"{entry.stem}.{os.getpid()}.tmp")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        written.write_text(json.dumps({"tokenizer": backend.to_str(),
                                       "model_max_length": int(tokenizer.model_max_length)}))
        os.replace(written, entry)
    except OSError:  # a read-only home, a full disk: the next start builds it again
        with suppress(OSError):
            written.unlink(missing_ok=True)
