"""The base model of every EmbeddingJob spec section: camelCase on the wire, unknown fields rejected."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """camelCase aliases, unknown fields rejected (matches the structural CRD schema)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
    )
