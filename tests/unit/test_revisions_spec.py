"""spec.sink.retainPrevious: hostile values refused naming the field (pydantic and the CRD alike); the name of a
vectors table's `_current` view, for every table name the spec allows (no database)."""

import pytest

from embedjob import api
from embedjob_worker.sink.revisions import current_view
from embedjob_worker.sink.target import VectorsTable
from support.crd_schema import fields, root_schema
from support.manifests import MINIMAL_SPEC, merged


@pytest.mark.parametrize("value, message", [
    (-1, "greater than or equal to 0"), (101, "less than or equal to 100"), (2**70, "less than or equal to 100"),
    (1.5, "valid integer"), ("1", "valid integer"), (True, "valid integer"),
    ("0; DELETE FROM embeddings", "integer"), ([1], "valid integer"),
])
def test_hostile_retain_counts_are_refused_naming_the_field(value, message):
    with pytest.raises(api.SpecError) as err:
        api.parse_spec(merged(MINIMAL_SPEC, {"sink": {"retainPrevious": value}}))
    assert "spec.sink.retainPrevious" in str(err.value) and message in str(err.value)


def test_one_previous_revision_is_kept_by_default_and_the_crd_checks_the_same_bounds():
    assert api.parse_spec(MINIMAL_SPEC).sink.retain_previous == 1
    assert api.parse_spec(merged(MINIMAL_SPEC, {"sink": {"retainPrevious": 0}})).sink.retain_previous == 0
    schema = dict(fields(root_schema()))["embeddingjobs.spec.sink.retainPrevious"]
    assert (schema["type"], schema["minimum"], schema["maximum"], schema["default"]) == ("integer", 0, 100, 1)


@pytest.mark.parametrize("name", ["embeddings", "e", "x" * 55, "x" * 56, "a" * 63, "docs_2024" + "y" * 54])
def test_the_view_is_named_after_its_table_within_postgresqls_63_bytes_and_apart_from_other_tables(name):
    view = current_view(VectorsTable("team_a", name))
    assert view.schema == "team_a" and view.name.endswith("_current") and len(view.name.encode()) <= 63
    if len(name) <= 55:
        assert view.name == f"{name}_current"
    else:  # cut, with a hash of the whole name: two long names sharing their first characters get two views
        other = current_view(VectorsTable("team_a", name[:-1] + "z"))
        assert view.name != other.name and view.name.startswith(name[:40])
