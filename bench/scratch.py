"""Scratch folders of a bench run in the system's temp folder, removed when the run's process exits."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path


def scratch_dir(prefix: str) -> Path:
    """A new folder named `prefix`…, gone after the process (a bench left one per run in the temp folder)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
