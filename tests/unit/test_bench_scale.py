"""bench/scale.py's parts: the records it generates, the count of vectors it expects, the cost of a further
record (the null model it embeds with: tests/integration/test_bench_null_model.py)."""

from __future__ import annotations

import json
import sys

import pytest

from support.paths import REPO

sys.path.insert(0, str(REPO / "bench"))
from memory import distinct_valid  # noqa: E402
from rounds import Figures  # noqa: E402
from scale import further_record, generate_dataset  # noqa: E402


def first_seen_with_text(records: list[dict]) -> int:
    """Each id's first record, counted when it has a text: the driver's rule (the first by position wins)."""
    seen, count = set(), 0
    for record in records:
        if record["id"] not in seen:
            seen.add(record["id"])
            count += record["text"] is not None
    return count


@pytest.mark.parametrize("count", [0, 1, 42, 43, 999, 1000, 2000, 4321, 20_000])
def test_the_expected_vectors_are_the_distinct_ids_with_a_text(tmp_path, count):
    generate_dataset(tmp_path / "input", count, files=7)
    files = sorted((tmp_path / "input").iterdir())
    records = [json.loads(line) for path in files for line in path.read_text().splitlines()]
    assert len(files) == 7 and len(records) == count
    assert distinct_valid(count) == first_seen_with_text(records)


def test_ids_run_on_across_files_and_a_repeat_reaches_into_an_earlier_file(tmp_path):
    generate_dataset(tmp_path / "input", 2000, files=4)
    files = sorted((tmp_path / "input").iterdir())
    first_ids = [json.loads(path.read_text().splitlines()[0])["id"] for path in files]
    assert first_ids == ["rec-0", "rec-500", "rec-1000", "rec-1500"]
    last = json.loads(files[1].read_text().splitlines()[-1])  # record 999: the id of record 499, in this file
    assert last["id"] == "rec-499" and any(json.loads(line)["id"] == "rec-499"
                                           for line in files[0].read_text().splitlines())


def test_a_further_record_costs_the_difference_of_the_totals_over_the_records_between():
    # 10 s fixed + 2 µs a record: 10,002 µs a record at 1,000 records, 1,002 at 10,000; one more record costs 2 µs
    # (round 2: 10,030,000 - 10,004,000 µs over 9,000 records)
    sizes = {"small": 1_000, "large": 10_000}
    per_record = {"small": [10_002.0, 10_004.0, 10_002.0], "large": [1_002.0, 1_003.0, 1_002.0]}
    results = {f"{label} {figure}": Figures(per_record[label]) for label in sizes
               for figure in ("driver_rss_mb", "driver_cpu_us", "wall_us", "postgres_cpu_us", "bookkeeping_bytes",
                              "vectors_bytes")}
    further = further_record(results, sizes)
    assert further["driver CPU (µs a record), small to large"].values == pytest.approx([2.0, 26 / 9, 2.0])
    assert not [name for name in further if "RSS" in name]  # a peak, not a sum
