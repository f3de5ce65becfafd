"""Reading the repository's Dockerfiles: instructions, build args, base image, copied sources, ENV, final user, pip
installs."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from support.paths import REPO

WORKER_DOCKERFILE = REPO / "worker_image" / "Dockerfile"
CONTROLLER_DOCKERFILE = REPO / "controller" / "Dockerfile"
#: the tests' worker image with a model baked in (envtest.images.build.model_image)
MODEL_CONTAINERFILE = REPO / "tests" / "envtest" / "images" / "model.Containerfile"


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
    """Each ARG's default as written; a bare `ARG NAME` (a stage re-declaring a global) keeps the earlier one."""
    defaults = {}
    for ins in instructions:
        if ins.keyword == "ARG":
            name, has_default, default = ins.arguments.partition("=")
            if has_default or name not in defaults:
                defaults[name] = default.strip('"')
    return defaults


ARG_REFERENCE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def expand_args(text: str, values: dict[str, str]) -> str:
    """``text`` with ${NAME}/$NAME replaced from ``values``, repeatedly (an ARG's default may name another ARG)."""
    for _ in range(len(values) + 1):
        expanded = ARG_REFERENCE.sub(lambda m: values[m.group(1) or m.group(2)], text)
        if expanded == text:
            return text
        text = expanded
    raise ValueError(f"build arguments refer to each other in a loop: {text}")


def base_image(instructions: list[Instruction], build_args: dict[str, str] | None = None) -> str:
    """The (last) FROM image with the build args' defaults (overridden by ``build_args``) substituted."""
    values = build_arg_defaults(instructions) | (build_args or {})
    (image,) = [ins.arguments.split()[0] for ins in instructions if ins.keyword == "FROM"]
    return expand_args(image, values)


def copy_sources(instructions: list[Instruction]) -> list[str]:
    """The build-context paths the COPY instructions read (what an image's content depends on)."""
    sources = []
    for ins in instructions:
        if ins.keyword == "COPY":
            words = [w for w in ins.arguments.split() if not w.startswith("--")]
            sources += words[:-1]
    return sources


def final_user(instructions: list[Instruction]) -> str:
    users = [ins.arguments for ins in instructions if ins.keyword == "USER"]
    assert users, "the image sets no USER (it would run as root)"
    return users[-1]


def env_settings(instructions: list[Instruction]) -> dict[str, str]:
    """The ENV instructions' NAME=VALUE pairs, later ones winning (the legacy `ENV NAME VALUE` form is not used)."""
    return dict(pair.split("=", 1) for ins in instructions if ins.keyword == "ENV"
                for pair in shlex.split(ins.arguments))


def pip_installs(instructions: list[Instruction]) -> list[str]:
    """The RUN instructions that pip install something."""
    return [ins.arguments for ins in instructions if ins.keyword == "RUN" and "pip install" in ins.arguments]


def extras_installed(run: str) -> set[str]:
    """The extras of the project requirement ("...src[worker]") in a pip install command."""
    return {extra for group in re.findall(r"src\[([\w,-]+)\]", run) for extra in group.split(",")}
