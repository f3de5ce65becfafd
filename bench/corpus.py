"""The corpus the benchmarks embed: the repository's PEP paragraphs (data/), or a JSONL file given by --corpus."""

from __future__ import annotations

import argparse
import json
import lzma
from itertools import islice
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "data" / "pep-paragraphs.jsonl.xz"


def add_corpus_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", type=Path, default=CORPUS,
                        help="JSONL records with id and text, plain or .xz (default: the repository's PEP paragraphs)")


def open_corpus(path: Path = CORPUS):
    """The corpus as a text file, decompressed on the fly when it ends in .xz."""
    return lzma.open(path, "rt", encoding="utf-8") if path.suffix == ".xz" else open(path, encoding="utf-8")


def first_records(count: int, path: Path = CORPUS) -> list[dict]:
    with open_corpus(path) as f:
        return [json.loads(line) for line in islice(f, count)]
