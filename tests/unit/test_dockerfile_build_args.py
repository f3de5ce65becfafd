"""The Dockerfiles' build arguments: the base image is one (its default the upstream base), and every global
ARG a build step uses is declared again in the stage, where Docker and buildah otherwise expand it to ""."""

from __future__ import annotations

import pytest

from support.dockerfiles import (
    CONTROLLER_DOCKERFILE,
    WORKER_DOCKERFILE,
    ARG_REFERENCE,
    base_image,
    expand_args,
    parse_dockerfile,
)

DOCKERFILES = [WORKER_DOCKERFILE, CONTROLLER_DOCKERFILE]
UPSTREAM_BASES = {WORKER_DOCKERFILE: "rayproject/ray:", CONTROLLER_DOCKERFILE: "python:3.11"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_the_base_image_is_a_build_argument_defaulting_to_the_upstream_base(dockerfile):
    instructions = parse_dockerfile(dockerfile)
    (from_,) = [ins.arguments for ins in instructions if ins.keyword == "FROM"]
    assert from_ == "${BASE_IMAGE}"
    assert base_image(instructions).startswith(UPSTREAM_BASES[dockerfile])
    assert base_image(instructions, {"BASE_IMAGE": "localhost/base:1"}) == "localhost/base:1"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_every_global_argument_a_build_step_uses_is_declared_in_the_stage(dockerfile):
    instructions = parse_dockerfile(dockerfile)
    from_at = [i for i, ins in enumerate(instructions) if ins.keyword == "FROM"][-1]
    declared_in_stage = {ins.arguments.partition("=")[0] for ins in instructions[from_at:] if ins.keyword == "ARG"}
    used = {m.group(1) or m.group(2) for ins in instructions[from_at + 1:] if ins.keyword != "ARG"
            for m in ARG_REFERENCE.finditer(ins.arguments)}
    global_args = {ins.arguments.partition("=")[0] for ins in instructions[:from_at] if ins.keyword == "ARG"}
    assert used & global_args <= declared_in_stage, sorted(used & global_args - declared_in_stage)


def test_argument_defaults_expand_through_each_other_and_a_loop_is_an_error():
    assert expand_args("${A}-$B", {"A": "${B}x", "B": "b"}) == "bx-b"
    with pytest.raises(ValueError, match="loop"):
        expand_args("${A}", {"A": "${B}", "B": "${A}"})
