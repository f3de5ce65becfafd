"""Reading the repository's Dockerfiles: instructions, base image, final user, pip installs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from support.paths import REPO

WORKER_DOCKERFILE = REPO / "worker_image" / "Dockerfile"
CONTROLLER_DOCKERFILE = REPO / "controller" / "Dockerfile"


@dataclass
class Instruction:
    keyword: str  #: upper case: FROM, ARG, RUN, ...
    arguments: str


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
        pending = ""
    assert not pending, f"{path}: dangling line continuation"
    return instructions


def build_arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    defaults = {}
    for ins in instructions:
        if ins.keyword == "ARG":
            name, _, default = ins.arguments.partition("=")
            defaults[name] = default.strip('"')
    return defaults


def base_image(instructions: list[Instruction]) -> str:
    """The (last) FROM image with the build args' defaults substituted."""
    defaults = build_arg_defaults(instructions)
    (image,) = [ins.arguments.split()[0] for ins in instructions if ins.keyword == "FROM"]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: defaults[m.group(1) or m.group(2)], image)


def final_user(instructions: list[Instruction]) -> str:
    users = [ins.arguments for ins in instructions if ins.keyword == "USER"]
    assert users, "the image sets no USER (it would run as root)"
    return users[-1]


def pip_installs(instructions: list[Instruction]) -> list[str]:
    """The RUN instructions that pip install something."""
    return [ins.arguments for ins in instructions if ins.keyword == "RUN" and "pip install" in ins.arguments]


def extras_installed(run: str) -> set[str]:
    """The extras of the project requirement ("...src[worker]") in a pip install command."""
    return {extra for group in re.findall(r"src\[([\w,-]+)\]", run) for extra in group.split(",")}
