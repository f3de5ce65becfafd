"""`embedjob model-revision DIR`: the revision a model directory's weights hash to, for spec.model.revision of a uri model."""

from __future__ import annotations

import argparse
import sys

from embedjob.contract import ExitCode

COMMAND = "model-revision"


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(COMMAND, help="print the revision of a local sentence-transformers model directory "
                                               "(spec.model.revision of a model uploaded to storage)")
    parser.add_argument("directory", help="the model's folder, as it is uploaded (its weights and config files)")


def run(args: argparse.Namespace) -> int:
    from embedjob_worker.encode.model_store import weights_revision

    try:
        print(weights_revision(args.directory))
    except OSError as exc:
        print(f"embedjob: {args.directory}: {exc}", file=sys.stderr)
        return ExitCode.INVALID_CONFIG
    return ExitCode.SUCCEEDED
