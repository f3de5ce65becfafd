"""A record's id and text from its fields: spec.source.textField, or spec.source.textTemplate rendered.

The readers (source/files.py) hand each record's fields here as a mapping (a JSON object, a CSV row, a Parquet
row). A template's field that a record lacks or that holds no text fails that record alone (BadReason
template_field, the detail naming the field); the record's other checks (plan/checks.py) then apply to the
rendered text as to any.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from embedjob.text_template import FieldNotText, TextTemplate, field_of

from embedjob_worker.core.records import BadReason, RawRecord

TextOf = str | TextTemplate  # spec.source.text_of: a field's name, or the template


def record_of(position: int, fields: Mapping[str, Any], id_field: str, text_of: TextOf) -> RawRecord:
    if isinstance(text_of, str):
        return RawRecord(position, fields.get(id_field), fields.get(text_of))
    try:
        text = text_of.render(lambda name: field_of(fields, name))
    except FieldNotText as exc:
        return RawRecord(position, fields.get(id_field), None, BadReason.template_field, str(exc)[:200])
    return RawRecord(position, fields.get(id_field), text)


def columns_for(available: Sequence[str], id_field: str, text_of: TextOf) -> list[str]:
    """The columns a columnar file is read with (its other columns are never read): the id's and the text's, or
    those the template's fields are in (a dotted field's top-level struct column where no column has its whole
    name). A template's column the file does not have is left out: its records then fail by that field."""
    if isinstance(text_of, str):
        return [id_field, text_of]
    wanted = [name if name in available else name.split(".")[0] for name in text_of.fields]
    return list(dict.fromkeys([id_field, *(name for name in wanted if name in available)]))
