"""The base of every EmbeddingJob API model, and the Kubernetes name patterns the sections share.

In a module of its own so that the spec's sections (`embedjob.api_sections`) and the pod
settings they hold (`embedjob.api_pods`) can both build on it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# Kubernetes names (RFC 1123), the one home of these patterns: a label (namespace, volume, queue
# names; at most 63 characters) and a subdomain, labels joined by dots (object names; at most 253).
_LABEL_BODY = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL = rf"^{_LABEL_BODY}$"
DNS_SUBDOMAIN = rf"^{_LABEL_BODY}(\.{_LABEL_BODY})*$"
SECRET_KEY = r"^[-._a-zA-Z0-9]+$"
# A SQL identifier we are willing to interpolate (quoted) into DDL.
SQL_IDENTIFIER = r"^[a-z_][a-z0-9_]{0,62}$"


class ApiModel(BaseModel):
    """camelCase aliases, unknown fields rejected (matches the structural CRD schema)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        # defaults go through validation too, so an enum default is its value ("torch") as a given one is
        validate_default=True,
    )


class SecretKeyRef(ApiModel):
    """A key of a Secret in the job's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN, description="Name of the Secret.")
    key: str = Field("url", min_length=1, max_length=253, pattern=SECRET_KEY, description="Key within the Secret.")
