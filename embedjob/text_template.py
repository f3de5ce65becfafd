"""spec.source.textTemplate: the text to embed built from several fields of a record, parsed once, rendered per record.

`{title}\\n\\n{body}`: each `{...}` is a field (a JSON line's key, a CSV or Parquet column), `{{` and `}}` are
literal braces. A name is taken as it is (spaces included); where a record has no field of that exact name, a
dotted name is a path into nested objects (`{meta.title}`: the `title` of the object `meta`). Parsed by the API
model (a template that does not parse is refused at apply time) and rendered by the source readers (a record
without a field, or whose field is not text, fails alone, naming the field).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_FIELDS = 64
MISSING = object()


@dataclass(frozen=True)
class Field:
    name: str


@dataclass(frozen=True)
class TextTemplate:
    parts: tuple[str | Field, ...]

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields it names, each once, in the order of first use."""
        return tuple(dict.fromkeys(p.name for p in self.parts if isinstance(p, Field)))

    def render(self, lookup: Callable[[str], Any]) -> str:
        """The text for one record, each field's value from `lookup` (MISSING where it has none); FieldNotText
        for the first field that is missing, null or not text."""
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            value = lookup(part.name)
            if not isinstance(value, str):
                raise FieldNotText(part.name, _what(value))
            out.append(value)
        return "".join(out)


class FieldNotText(ValueError):
    """A field of textTemplate that a record lacks or holds no text in."""

    def __init__(self, name: str, what: str):
        super().__init__(f"textTemplate field {name!r} {what}")
        self.name = name


def _what(value: Any) -> str:
    if value is MISSING:
        return "is missing"
    if value is None:
        return "is null"
    kind = {bool: "a boolean", int: "a number", float: "a number", dict: "an object", list: "a list",
            bytes: "bytes"}.get(type(value), type(value).__name__)
    return f"is {kind}, not text"


def parse_template(template: str) -> TextTemplate:
    """The template's parts; ValueError saying where it does not parse."""
    parts: list[str | Field] = []
    literal: list[str] = []
    i = 0
    while i < len(template):
        char = template[i]
        if template.startswith("{{", i) or template.startswith("}}", i):
            literal.append(char)
            i += 2
        elif char == "}":
            raise ValueError(f"a lone '}}' at character {i} (write '}}}}' for a brace)")
        elif char == "{":
            end = template.find("}", i + 1)
            name = template[i + 1:end] if end != -1 else ""
            if end == -1 or "{" in name:
                raise ValueError(f"the field opened at character {i} is not closed (write '{{{{' for a brace)")
            if not name.strip():
                raise ValueError(f"an empty field at character {i}")
            parts.extend(["".join(literal), Field(name)] if literal else [Field(name)])
            literal = []
            i = end + 1
        else:
            literal.append(char)
            i += 1
    if literal:
        parts.append("".join(literal))
    parsed = TextTemplate(tuple(parts))
    if not parsed.fields:
        raise ValueError("it names no field: every record would be embedded as the same text")
    if len(parsed.fields) > MAX_FIELDS:
        raise ValueError(f"it names {len(parsed.fields)} fields, more than {MAX_FIELDS}")
    return parsed


def field_of(record: Mapping[str, Any], name: str) -> Any:
    """A field of a record (a JSON object, a row): the key `name` itself, else the dotted path into nested
    objects; MISSING where there is neither."""
    if name in record:
        return record[name]
    value: Any = record
    for key in name.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return MISSING
        value = value[key]
    return value
