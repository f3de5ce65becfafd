"""Pure tests of batch formation, batch ids, completion-order matching and the job-config codec."""

import random

import pytest

from embedjob.api import SpecError
from embedjob.contract import decode_job_config, encode_job_config
from embedjob_worker.plan.batching import batch_id, batch_key, length_sorted_windows, make_batches
from embedjob_worker.encode.inflight import InFlightBatches
from embedjob_worker.core.records import Record

KEY = batch_key("input-fingerprint", "config-fingerprint")


def records(n: int, seed: int = 7) -> list[Record]:
    rng = random.Random(seed)
    return [Record(i, f"r{i}", "x" * rng.randint(1, 60)) for i in range(n)]


def test_batches_are_deterministic_and_ids_stable_across_reruns():
    first = list(make_batches(iter(records(500)), batch_size=16, sort_window=128, key=KEY))
    again = list(make_batches(iter(records(500)), batch_size=16, sort_window=128, key=KEY))
    assert [b.batch_id for b in first] == [b.batch_id for b in again]
    assert [[r.id for r in b.records] for b in first] == [[r.id for r in b.records] for b in again]
    assert len({b.batch_id for b in first}) == len(first)
    # Every record lands in exactly one batch.
    assert sorted(r.position for b in first for r in b.records) == list(range(500))


def test_batch_ids_change_with_the_input_snapshot_or_config():
    other_input = batch_key("changed-input", "config-fingerprint")
    other_config = batch_key("input-fingerprint", "changed-config")
    ids = {batch_id(k, ["a", "b"]) for k in (KEY, other_input, other_config)}
    assert len(ids) == 3
    assert batch_id(KEY, ["a", "b"]) != batch_id(KEY, ["b", "a"])
    # No ambiguity from concatenation: ("ab",) and ("a", "b") differ.
    assert batch_id(KEY, ["ab"]) != batch_id(KEY, ["a", "b"])


def test_windows_are_bounded_and_sorted_longest_first_then_by_position():
    stream = records(1000)
    consumed = []

    def tracking():
        for r in stream:
            consumed.append(r)
            yield r

    windows = length_sorted_windows(tracking(), 100)
    window = next(windows)
    # Only the first window has been read: the input is streamed, not loaded.
    assert len(consumed) == 100 and len(window) == 100
    assert window == sorted(stream[:100], key=lambda r: (-len(r.text), r.position))
    assert all(len(w) <= 100 for w in windows)


def test_batches_within_a_window_have_similar_lengths():
    batches = list(make_batches(iter(records(256)), batch_size=32, sort_window=256, key=KEY))
    spreads = [max(len(r.text) for r in b.records) - min(len(r.text) for r in b.records) for b in batches]
    unsorted = list(make_batches(iter(records(256)), batch_size=32, sort_window=0, key=KEY))
    unsorted_spreads = [max(len(r.text) for r in b.records) - min(len(r.text) for r in b.records) for b in unsorted]
    assert sum(spreads) < sum(unsorted_spreads) / 4
    # sortWindow 0 keeps input order.
    assert [r.position for b in unsorted for r in b.records] == list(range(256))


def test_results_are_matched_by_batch_id_in_completion_order():
    batches = list(make_batches(iter(records(64)), batch_size=8, sort_window=64, key=KEY))
    in_flight = InFlightBatches()
    for b in batches:
        in_flight.add(b.batch_id, b)
    # Results arrive in an order unrelated to submission.
    completion_order = list(reversed(batches[::2])) + batches[1::2]
    for expected in completion_order:
        assert in_flight.complete(expected.batch_id) is expected
    assert len(in_flight) == 0
    with pytest.raises(KeyError):
        in_flight.complete(batches[0].batch_id)  # a duplicate or stray result is not silently accepted
    in_flight.add(batches[0].batch_id, batches[0])
    with pytest.raises(ValueError):
        in_flight.add(batches[0].batch_id, batches[0])


def test_job_config_round_trips_and_keeps_only_what_the_driver_needs():
    manifest = {
        "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob",
        "metadata": {"name": "j", "namespace": "ns", "uid": "u-1", "annotations": {"a": "b"}, "resourceVersion": "9"},
        "spec": {"source": {"uri": "s3://b/k.jsonl"}}, "status": {"state": "Running"},
    }
    encoded = encode_job_config(manifest)
    assert encoded.isascii() and " " not in encoded and "'" not in encoded
    assert decode_job_config(encoded) == {
        "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob",
        "metadata": {"name": "j", "namespace": "ns", "uid": "u-1"}, "spec": {"source": {"uri": "s3://b/k.jsonl"}},
    }
    with pytest.raises(SpecError, match="--config-b64"):
        decode_job_config("not base64!")
