"""A record's metadata (metadataFields, metadataFieldMap): its fields' values as one JSON object's text, or why it has none.

The text is canonical (keys sorted, no spaces, UTF-8 as it is), so the same values give the
same text and the same metadata hash on every read. A field the record lacks is null. A value
is kept as JSON has it (text, number, true/false, null, objects and lists, as in a JSON line);
a date or time as its ISO 8601 text, a UUID or an exact numeric (Decimal) as its text. A value
jsonb cannot hold (text with NUL or bytes that are not UTF-8, NaN or an infinity, raw bytes)
fails the record with BadReason metadata_field naming the field; metadata over
MAX_METADATA_BYTES fails it with metadata_too_large, naming its largest field.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import uuid
from collections.abc import Mapping
from typing import Any

from embedjob.api import MAX_METADATA_BYTES
from embedjob.text_template import MISSING, field_of

from embedjob_worker.core.records import BadReason


class _NotJson(Exception):
    """A value jsonb cannot hold; the message says what it is."""


#: what the metadata keeps, as (its name there, the field it is read from) pairs: Source.metadata
MetadataFields = tuple[tuple[str, str], ...]


def metadata_of(fields: Mapping[str, Any], metadata: MetadataFields) -> str | tuple[BadReason, str]:
    """The JSON text of the `metadata` fields' values in `fields` (a JSON object, a row), each under its name, or why
    the record cannot have it."""
    values = {}
    for name, field in metadata:
        value = field_of(fields, field)
        try:
            values[name] = _json_value(None if value is MISSING else value)
        except _NotJson as exc:
            named = repr(name) if name == field else f"{name!r} ({field!r})"
            return BadReason.metadata_field, f"metadata field {named}: {exc}"[:200]
    text = json.dumps(values, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)
    size = len(text.encode("utf-8"))
    if size > MAX_METADATA_BYTES:
        largest = max(values, key=lambda n: len(json.dumps(values[n], ensure_ascii=False)))
        return BadReason.metadata_too_large, (f"metadata of {size} bytes, over the limit of {MAX_METADATA_BYTES} "
                                              f"(largest field {largest!r})")[:200]
    return text


def _json_value(value: Any) -> Any:
    """`value` as JSON holds it (see the module docstring); _NotJson for what it cannot."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NotJson(f"{value} is no JSON number")
        return value
    if isinstance(value, str):
        return _json_text(value)
    if isinstance(value, Mapping):
        return {_json_text(str(key)): _json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(item) for item in value]
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise _NotJson(f"{value} is no JSON number")
        return str(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    raise _NotJson(f"a {type(value).__name__}, which JSON cannot hold")


def _json_text(text: str) -> str:
    if "\x00" in text:
        raise _NotJson(f"text with a NUL character at offset {text.index(chr(0))}, which jsonb cannot store")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _NotJson("text that is not valid UTF-8") from None
    return text
