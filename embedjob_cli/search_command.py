"""`embedjob search`'s arguments: the manifest, the query, and how many neighbours of which revision, filtered how."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from embedjob.contract import DATABASE_URL_ENV

from embedjob_cli.search import DEFAULT_EF_SEARCH, MAX_EF_SEARCH, where_condition


def add_command(commands: argparse._SubParsersAction) -> None:
    search = commands.add_parser("search", help="nearest neighbours of a query in the job's collection")
    search.add_argument("manifest", type=Path)
    search.add_argument("query")
    search.add_argument("-k", type=int, default=5, help="how many neighbours (default 5)")
    search.add_argument("--database-url", default=os.environ.get(DATABASE_URL_ENV))
    search.add_argument("--ef-search", type=_ef_search, help=f"HNSW candidate list (hnsw.ef_search, 1-{MAX_EF_SEARCH}; "
                        f"default {DEFAULT_EF_SEARCH} or k if more): higher finds more true neighbours, slower")
    search.add_argument("--prompt", help="the text put before the query (default: the model's query prompt where its "
                        "config declares one, else its default prompt, else none; \"\" for none)")
    search.add_argument("--where", action="append", default=[], type=_where, metavar="KEY=VALUE",
                        help="only vectors whose metadata (spec.source.metadataFields) has KEY equal to VALUE; "
                        "repeat for more (all must hold)")
    search.add_argument("--incoming", action="store_true", help="read the manifest's revision even when it is not "
                        "the collection's ready one (a switch-over in progress; docs/revisions.md)")
    search.add_argument("--verbose", "-v", action="store_true",
                        help="show what the libraries print on their own (silenced otherwise)")


def _ef_search(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= MAX_EF_SEARCH:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_EF_SEARCH}")
    return int(value)


def _where(value: str) -> tuple[str, str]:
    try:
        return where_condition(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
