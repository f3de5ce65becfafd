"""The README's "Running locally" commands, run as written: `embedjob run` on the quickstart, then `embedjob search`."""

from __future__ import annotations

import os
import subprocess

import pytest

from support.doc_commands import doc_commands
from support.paths import REPO

pytestmark = pytest.mark.slow


def _readme(subcommand: str):
    """The README's one `embedjob SUBCOMMAND` line (written the same wherever it appears)."""
    commands = [c for c in doc_commands("embedjob") if c.document.name == "README.md" and c.argv[1] == subcommand]
    assert commands and all((c.env, c.argv) == (commands[0].env, commands[0].argv) for c in commands), commands
    return commands[0]


def _run(command, data_home) -> subprocess.CompletedProcess:
    # the embedded PostgreSQL lives under the user data dir: a fresh one for this test
    env = {**os.environ, **command.env, "XDG_DATA_HOME": str(data_home)}
    env.pop("EMBEDJOB_DATABASE_URL", None)
    return subprocess.run(command.argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def test_the_readmes_local_commands_run_as_written(tmp_path):
    run, search = _readme("run"), _readme("search")

    embedded = _run(run, tmp_path)
    assert embedded.returncode == 0, embedded.stderr[-3000:]
    summary = embedded.stdout + embedded.stderr
    assert "succeeded" in summary and "989" in summary, summary[-3000:]

    found = _run(search, tmp_path)
    assert found.returncode == 0, found.stderr[-3000:]
    header, *hits = [line for line in found.stdout.splitlines() if line.strip()]
    assert header.split() == ["distance", "id", "chunk", "chars", "snippet"]
    assert len(hits) == int(search.argv[search.argv.index("-k") + 1])
    assert "decorator" in found.stdout.lower()  # the README promises decorators; PEP 318/698 paragraphs answer
