"""The spec's source section: a file, a dataset of many files or a table; the text's fields and the metadata's.

`embedjob.api` assembles it into `EmbeddingJobSpec` (import it from there); the table's own parts are in
`embedjob.api_table`.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated

from pydantic import ConfigDict, Field, field_validator, model_validator

from .api_base import ApiModel, SecretKeyRef
from .api_rules import cel
from .api_table import SOURCE_IDENTIFIER, SourceTable
from .text_template import TextTemplate, parse_template


class SourceFormat(str, Enum):
    jsonl = "jsonl"
    csv = "csv"
    parquet = "parquet"


DEFAULT_TEXT_FIELD = "text"
TABLE_TEXT = ("a table source takes its text from table.textColumn or from textTemplate (its fields the table's "
              "columns): set exactly one")
TABLE_TEMPLATE_FIELD = ("a table source's textTemplate fields are its columns: letters, digits and underscores, not "
                        "starting with a digit, at most 63 characters")
TEMPLATE_OR_TEXT_FIELD = "set textTemplate or textField, not both: the template names its fields itself"
MAX_METADATA_FIELDS = 32
# A record's metadata (its JSON) larger than this fails the record (metadata_too_large).
MAX_METADATA_BYTES = 64 * 1024
METADATA_COLUMN = ("a table source's metadataFields are its columns: letters, digits and underscores, not starting "
                   "with a digit, at most 63 characters")
METADATA_TWICE = "a name is kept twice: in metadataFields and as a key of metadataFieldMap"
METADATA_COUNT = f"metadataFields and metadataFieldMap keep {MAX_METADATA_FIELDS} fields at most, together"
METADATA_NAME_CHARS = 256  # a metadata name's or field's length at most
METADATA_NAME = f"a metadataFieldMap name is text of 1-{METADATA_NAME_CHARS} characters without NUL"
_METADATA_NAME = Annotated[str, Field(min_length=1, max_length=METADATA_NAME_CHARS, pattern=r"^[^\x00]*$")]
_METADATA_KEPT = (
    "kept beside each record's vectors, in the vectors table's metadata (jsonb). A field is a field of a JSON line (a "
    "dotted name is a path into nested objects where no field has the name itself), a column of a CSV or Parquet file "
    "or of the table. A field a record lacks is null; a value JSON cannot hold (NUL, not UTF-8, NaN, bytes) or metadata "
    f"over {MAX_METADATA_BYTES // 1024} KiB fails that record alone, naming the field. A re-run updates metadata that "
    "alone changed without embedding the text again (docs/sources.md).")


def _metadata_rules() -> list[dict[str, str]]:
    """The CEL rules across metadataFields and metadataFieldMap (each one's own bounds are in its schema)."""
    fields, renamed = "self.metadataFields", "self.metadataFieldMap"
    count = f"(has({fields}) ? size({fields}) : 0) + (has({renamed}) ? size({renamed}) : 0)"
    return [
        cel(f"!has({fields}) || {fields}.all(n, {fields}.exists_one(m, m == n))", "a field is named twice",
            ".metadataFields"),
        cel(f"!has({renamed}) || {renamed}.all(k, k.matches('^[^\\\\x00]{{1,{METADATA_NAME_CHARS}}}$'))", METADATA_NAME,
            ".metadataFieldMap"),
        cel(f"!has({fields}) || !has({renamed}) || {fields}.all(n, !(n in {renamed}))", METADATA_TWICE,
            ".metadataFieldMap"),
        cel(f"{count} <= {MAX_METADATA_FIELDS}", METADATA_COUNT, ".metadataFieldMap"),
        cel(f"!has(self.table) || ((!has({fields}) || {fields}.all(n, n.matches('{SOURCE_IDENTIFIER}'))) && "
            f"(!has({renamed}) || {renamed}.all(k, {renamed}[k].matches('{SOURCE_IDENTIFIER}'))))",
            METADATA_COLUMN, ".metadataFields"),
    ]


class Source(ApiModel):
    """Where the texts come from: one file or a dataset of many (uri), or one PostgreSQL table or view (table),
    streamed record by record (never loaded whole)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("has(self.uri) != has(self.table)", "set exactly one of uri and table", ".uri"),
                cel("!has(self.table) || has(self.table.textColumn) != has(self.textTemplate)", TABLE_TEXT,
                    ".textTemplate"),
                *_metadata_rules(),
                cel("!has(self.databaseSecretRef) || has(self.table)",
                    "databaseSecretRef names the database of a table source; a file source has none",
                    ".databaseSecretRef"),
            ]
        }
    )

    uri: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=2048,
            description="The input file: a URL (s3://, gs://, az://, https://, file:///...) or, on a cluster, an "
            "absolute path in the worker image or on a volume mounted into the Ray pods (a relative path is "
            "refused: RelativeSourcePath). `embedjob run` also takes a path relative to the manifest's directory. "
            "A dataset of many files: a prefix ending in / (every file under it whose name ends in the format's "
            "extension) or a glob (*, ?, [...], ** across folders), read in lexical order of key (docs/sources.md).",
        ),
    ] = None
    format: SourceFormat = Field(
        SourceFormat.jsonl,
        description="Input format: jsonl (one JSON object a line), csv (with a header row) or parquet."
    )
    id_field: str = Field(
        "id", min_length=1, max_length=256,
        description="Field (column) holding each record's id, unique within the input; the id of its vector row.",
    )
    text_field: str = Field(
        DEFAULT_TEXT_FIELD, min_length=1, max_length=256, description="Field (column) holding the text to embed."
    )
    text_template: str | None = Field(
        None, min_length=1, max_length=4096, pattern=r"^[^\x00]*$",
        description="The text to embed built from several fields instead of textField, e.g. \"{title}\\n\\n{body}\": "
        "each {name} a field of a JSON line (a dotted name is a path into nested objects where no field has the "
        "name itself), a column of a CSV or Parquet file, or a column of the table (instead of table.textColumn); "
        "{{ and }} are braces. A record without one of the fields, or whose field is not text, fails alone (reason "
        "template_field, naming it). Not with a textField other than text (docs/sources.md).",
    )
    metadata_fields: list[_METADATA_NAME] | None = Field(
        None, min_length=1, max_length=MAX_METADATA_FIELDS,
        description=f"Fields {_METADATA_KEPT} Each is kept under its own name; metadataFieldMap keeps fields under "
        "other names.")
    metadata_field_map: dict[str, _METADATA_NAME] | None = Field(
        None, min_length=1, max_length=MAX_METADATA_FIELDS,
        description="Fields kept under other names: name -> field ({title: doc.title, lang: meta.language}), "
        f"{_METADATA_KEPT} With metadataFields, a name is kept once and {MAX_METADATA_FIELDS} at most in all.")
    table: SourceTable | None = Field(
        None, description="A PostgreSQL table or view to embed instead of a file (docs/table-source.md).")
    database_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret key holding the URL of the database the table is in. Unset: the sink's database.")

    @model_validator(mode="after")
    def _one_source(self) -> "Source":
        if (self.uri is None) == (self.table is None):
            raise ValueError("set exactly one of uri and table")
        if self.database_secret_ref is not None and self.table is None:
            raise ValueError("databaseSecretRef names the database of a table source; a file source has none")
        if self.table is not None and (self.table.text_column is None) == (self.text_template is None):
            raise ValueError(TABLE_TEXT)
        if self.table is not None and self.text_template is not None:
            for name in parse_template(self.text_template).fields:
                if not re.fullmatch(SOURCE_IDENTIFIER, name):
                    raise ValueError(f"textTemplate field {name!r}: {TABLE_TEMPLATE_FIELD}")
        if self.text_template is not None and self.text_field != DEFAULT_TEXT_FIELD:
            raise ValueError(TEMPLATE_OR_TEXT_FIELD)
        twice = sorted(set(self.metadata_fields or ()) & set(self.metadata_field_map or {}))
        if twice:
            raise ValueError(f"metadataFieldMap.{twice[0]}: {METADATA_TWICE}")
        if len(self.metadata) > MAX_METADATA_FIELDS:
            raise ValueError(METADATA_COUNT)
        if self.table is not None:
            for where, (_, field) in zip(self.metadata_places, self.metadata):
                if not re.fullmatch(SOURCE_IDENTIFIER, field):
                    raise ValueError(f"{where}: {METADATA_COLUMN}")
        return self

    @field_validator("metadata_fields")
    @classmethod
    def _metadata_names_once(cls, names: list[str] | None) -> list[str] | None:
        for index, name in enumerate(names or []):
            if name in names[:index]:
                raise ValueError(f"metadataFields[{index}]: {name!r} is named twice")
        return names

    @field_validator("metadata_field_map")
    @classmethod
    def _metadata_map_names(cls, renamed: dict[str, str] | None) -> dict[str, str] | None:
        for name in renamed or {}:
            if not 1 <= len(name) <= METADATA_NAME_CHARS or "\x00" in name:
                raise ValueError(f"metadataFieldMap key {name[:64]!r}: {METADATA_NAME}")
        return renamed

    @field_validator("text_template")
    @classmethod
    def _template_parses(cls, template: str | None) -> str | None:
        if template is not None:
            parse_template(template)  # its ValueError says where
        return template

    @property
    def template(self) -> TextTemplate | None:
        """textTemplate parsed, None without one."""
        return parse_template(self.text_template) if self.text_template is not None else None

    @property
    def text_of(self) -> str | TextTemplate:
        """What the readers take each record's text from: textTemplate parsed, else textField."""
        return self.template or self.text_field

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What the metadata keeps, as (its name there, the field it is read from) pairs: metadataFields' fields under
        their own names, then metadataFieldMap's."""
        return (*((name, name) for name in self.metadata_fields or ()), *(self.metadata_field_map or {}).items())

    @property
    def metadata_places(self) -> tuple[str, ...]:
        """Where each pair of `metadata` is in the spec, for messages: metadataFields[0], metadataFieldMap.title."""
        return (*(f"metadataFields[{index}]" for index in range(len(self.metadata_fields or ()))),
                *(f"metadataFieldMap.{name}" for name in self.metadata_field_map or {}))
