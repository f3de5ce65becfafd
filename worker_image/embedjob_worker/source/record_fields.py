"""A record's id, text and metadata from its fields: textField or textTemplate rendered, and metadataFields.

The readers (source/files.py) hand each record's fields here as a mapping (a JSON object, a CSV row, a Parquet
row). A template's field that a record lacks or that holds no text fails that record alone (BadReason
template_field, the detail naming the field); the record's other checks (plan/checks.py) then apply to the
rendered text as to any.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from embedjob.text_template import FieldNotText, TextTemplate, field_of

from embedjob_worker.core.records import BadReason, RawRecord
from embedjob_worker.source.record_metadata import MetadataFields, metadata_of

TextOf = str | TextTemplate  # spec.source.text_of: a field's name, or the template


@dataclass(frozen=True)
class RecordFields:
    """The fields a source's records are made of: the id's, the text's (or the template's), the metadata's."""

    id_field: str
    text_of: TextOf
    metadata: MetadataFields = ()

    def record(self, position: int, fields: Mapping[str, Any]) -> RawRecord:
        return record_of(position, fields, self.id_field, self.text_of, self.metadata)

    def text_columns(self) -> frozenset[str]:
        """The fields besides the id that are read as text (a binary column's bytes decoded, as a file's are)."""
        return frozenset([self.text_of] if isinstance(self.text_of, str) else self.text_of.fields) - {self.id_field}


def record_of(position: int, fields: Mapping[str, Any], id_field: str, text_of: TextOf,
              metadata: MetadataFields = ()) -> RawRecord:
    """The record of `fields`: its id, its text and, with `metadata` (Source.metadata), their values' JSON
    (record_metadata); a record with a field it cannot use as a problem, naming the field."""
    record_id = fields.get(id_field)
    if isinstance(text_of, str):
        text = fields.get(text_of)
    else:
        try:
            text = text_of.render(lambda name: field_of(fields, name))
        except FieldNotText as exc:
            return RawRecord(position, record_id, None, BadReason.template_field, str(exc)[:200])
    if not metadata:
        return RawRecord(position, record_id, text)
    kept = metadata_of(fields, metadata)
    if isinstance(kept, tuple):
        return RawRecord(position, record_id, text, *kept)
    return RawRecord(position, record_id, text, metadata=kept)


def columns_for(available: Sequence[str], id_field: str, text_of: TextOf, metadata: MetadataFields = ()) -> list[str]:
    """The columns a columnar file is read with (its other columns are never read): the id's and the text's, or
    those the template's fields are in, and the metadata's (a dotted field's top-level struct column where no
    column has its whole name). A field's column the file does not have is left out: a template's records then
    fail by that field; a metadata field is null."""
    named = [text_of] if isinstance(text_of, str) else list(text_of.fields)
    wanted = [name if name in available else name.split(".")[0] for name in (*named, *(field for _, field in metadata))]
    if isinstance(text_of, str) and not metadata:
        return [id_field, text_of]
    return list(dict.fromkeys([id_field, *(name for name in wanted if name in available)]))
