"""The shell commands in the README's and docs' fenced blocks, one logical line each, for tests that run or check them."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from support.paths import REPO

DOCUMENTS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
SHELL_BLOCK = re.compile(r"^[ \t]*```(bash|sh|shell|console)\n(.*?)^[ \t]*```", re.S | re.M)
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=[^$(\s]*$")


@dataclass(frozen=True)
class DocCommand:
    document: Path
    line: str  # the logical line as written (continuations joined, comment cut)
    env: dict[str, str]  # leading VAR=value assignments
    argv: list[str]  # the command after them

    def __str__(self) -> str:
        return f"{self.document.relative_to(REPO)}: {self.line}"


def _logical_lines(block: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def _commands(document: Path, line: str) -> list[DocCommand]:
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # a quoted jsonpath or a pipeline into a loop: not a simple command
        return []
    found, current = [], []
    for word in [*words, "&&"]:
        if word not in ("&&", "||", ";", "|"):
            current.append(word)
            continue
        env = {}
        while current and ENV_ASSIGNMENT.match(current[0]):
            name, value = current.pop(0).split("=", 1)
            env[name] = value
        if current:
            found.append(DocCommand(document, line, env, current))
        current = []
    return found


def doc_commands(program: str | None = None) -> list[DocCommand]:
    """Every simple command in a shell block of the README and docs/*.md (`program`: only those)."""
    found = []
    for document in DOCUMENTS:
        for match in SHELL_BLOCK.finditer(document.read_text()):  # unlabelled blocks are synopses
            for line in _logical_lines(match.group(2)):
                found += _commands(document, line)
    return [c for c in found if program is None or c.argv[0] == program]
