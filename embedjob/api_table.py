"""The table source's spec (spec.source.table): identifiers and a filter that cannot carry SQL.

Every identifier matches SOURCE_IDENTIFIER and is quoted when used; a filter is a list of
`column op value` conditions from a fixed set of operators, combined with AND, whose
values the driver binds as query parameters (embedjob_worker.source.table builds the SQL).
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import ConfigDict, Field, model_validator

from .api_base import ApiModel
from .api_rules import cel

# A PostgreSQL identifier of a source table, view or column: quoted when used (so case is
# kept), at most 63 bytes (PostgreSQL's NAMEDATALEN - 1), letters, digits and underscores.
SOURCE_IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
_IDENTIFIER_TEXT = "letters, digits and underscores, not starting with a digit, at most 63 characters"
MAX_FILTER_VALUES = 1000


class FilterOp(str, Enum):
    """The comparisons a source filter may use; each becomes a fixed SQL operator."""

    eq = "eq"
    ne = "ne"
    lt = "lt"
    le = "le"
    gt = "gt"
    ge = "ge"
    in_ = "in"
    is_null = "isNull"
    is_not_null = "isNotNull"


NULL_OPS = (FilterOp.is_null.value, FilterOp.is_not_null.value)


class TableFilter(ApiModel):
    """One condition on a source row: `column op value`. The conditions of a filter are combined with
    AND; values are sent as query parameters (never spliced into SQL) and PostgreSQL converts them to
    the column's type."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self.op in ['isNull', 'isNotNull'] ? !has(self.value) && !has(self.values) : true",
                    "isNull and isNotNull take neither value nor values", ".op"),
                cel("self.op == 'in' ? has(self.values) && !has(self.value) : true",
                    "op in takes values (a list), not value", ".values"),
                cel("self.op in ['eq', 'ne', 'lt', 'le', 'gt', 'ge'] ? has(self.value) && !has(self.values) : true",
                    "this op takes value, not values", ".value"),
            ]
        }
    )

    column: str = Field(pattern=SOURCE_IDENTIFIER, max_length=63,
                        description=f"Column of the source table or view ({_IDENTIFIER_TEXT}).")
    op: FilterOp = Field(description="eq, ne, lt, le, gt, ge (with value), in (with values), isNull or isNotNull.")
    value: str | None = Field(None, max_length=4096, description="The value compared with (a string; PostgreSQL "
                              "converts it to the column's type, e.g. \"42\", \"true\", \"2026-01-31\").")
    values: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        None, min_length=1, max_length=MAX_FILTER_VALUES,
        description=f"The values of op in (1-{MAX_FILTER_VALUES} strings, converted like value).")

    @model_validator(mode="after")
    def _operands_fit_op(self) -> "TableFilter":
        if self.op in NULL_OPS and (self.value is not None or self.values is not None):
            raise ValueError("isNull and isNotNull take neither value nor values")
        if self.op == FilterOp.in_.value and (self.values is None or self.value is not None):
            raise ValueError("op in takes values (a list), not value")
        if self.op not in (*NULL_OPS, FilterOp.in_.value) and (self.value is None or self.values is not None):
            raise ValueError("this op takes value, not values")
        return self


DEFAULT_CHANGE_SKEW_SECONDS = 60
SKEW_NEEDS_CHANGE_COLUMN = ("!has(self.changeSkewSeconds) || has(self.changeColumn)",
                            "changeSkewSeconds moves changeColumn's watermark back: set changeColumn too")


class SourceTable(ApiModel):
    """A PostgreSQL table or view to embed, read in id order in keyset pages (never loaded whole)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel(*SKEW_NEEDS_CHANGE_COLUMN, ".changeSkewSeconds")]})

    table_schema: str = Field("public", alias="schema", pattern=SOURCE_IDENTIFIER, max_length=63,
                              description=f"Schema of the table or view ({_IDENTIFIER_TEXT}).")
    name: str = Field(pattern=SOURCE_IDENTIFIER, max_length=63,
                      description=f"The table or view ({_IDENTIFIER_TEXT}).")
    id_column: str = Field(pattern=SOURCE_IDENTIFIER, max_length=63,
                           description="Column holding each row's id (unique; read as text), the id of its vector row "
                           "and the order rows are read in.")
    text_column: str | None = Field(
        None, pattern=SOURCE_IDENTIFIER, max_length=63,
        description="Column holding the text to embed; or, instead, source.textTemplate built from columns.")
    filter: list[TableFilter] = Field(
        default_factory=list, max_length=16,
        description="Conditions a row must meet to be embedded (all of them, AND); at most 16. Rows outside "
        "the filter count as missing for sync.deleteMissing.",
    )
    change_column: str | None = Field(
        None, pattern=SOURCE_IDENTIFIER, max_length=63,
        description="A timestamp with time zone column set to the database's clock on every insert and update "
        "(now(), clock_timestamp(), a trigger), or an xid8 column set to pg_current_xact_id(): a re-run reads "
        "only rows at or past the last run's watermark, and rows where it is NULL (docs/table-source.md). Unset: "
        "every run reads every row.",
    )
    change_skew_seconds: int | None = Field(
        None, ge=0, le=86_400, strict=True,
        description="Seconds the watermark is moved back, for a change column written from the clock of another "
        f"machine than the database's (0-86400). Unset: {DEFAULT_CHANGE_SKEW_SECONDS}. With changeColumn; an "
        "xid8 column has no clock to skew, and ignores it.",
    )

    @property
    def skew_seconds(self) -> int:
        """changeSkewSeconds, or its default (unset in the CRD, where a default would count as set for its rule)."""
        return DEFAULT_CHANGE_SKEW_SECONDS if self.change_skew_seconds is None else self.change_skew_seconds

    @model_validator(mode="after")
    def _skew_of_a_change_column(self) -> "SourceTable":
        if self.change_skew_seconds is not None and self.change_column is None:
            raise ValueError(SKEW_NEEDS_CHANGE_COLUMN[1])
        return self
