"""Rules shared by the pod-settings models: object rules (CEL and Python alike), Kubernetes names and quantities.

An `ObjectRule` constrains several fields of one object; like `api_rules.FieldRule` it is
one CEL rule for the CRD and the same check in Python, with one message that names the
field. A model lists its rules in `RULES`; `RuledModel` puts them into the schema and
enforces them after parsing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, ClassVar

from pydantic import ConfigDict, model_validator
from pydantic.alias_generators import to_snake

from .api_base import ApiModel
from .api_rules import LABEL_KEY, FieldRule, cel

# A DNS-1123 label (volume names, namespaces).
# A label key's prefix (253) and name (63) and the slash.
LABEL_KEY_MAX = 317
# Kubernetes resource.Quantity, without a sign: 500m, 2Gi, 1.5, 1e3.
QUANTITY = r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][-+]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
# Text with no NUL (the kubelet cannot pass one to a process).
NO_NUL = r"^[^\x00]*$"
# Bounds that keep CEL's cost estimate (and a hostile manifest) small.
MAX_LIST = 32
MAX_MAP = 64

_SUFFIXES = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
             "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
             "P": Decimal("1e15"), "E": Decimal("1e18"),
             **{f"{p}i": Decimal(1024) ** (i + 1) for i, p in enumerate("KMGTPE")}}


def quantity_value(text: str) -> Decimal:
    """The number a Kubernetes quantity stands for (2Gi -> 2147483648); ValueError if it is none."""
    if not re.fullmatch(QUANTITY, text):
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2Gi)")
    number = re.match(r"^[0-9.]+", text).group(0)
    suffix = text[len(number):]
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number) * Decimal(10) ** Decimal(suffix[1:])
        return Decimal(number) * _SUFFIXES[suffix]
    except (InvalidOperation, KeyError):
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2Gi)") from None


@dataclass(frozen=True)
class ObjectRule:
    """A rule across the fields of one object: `allows(model)` in Python, `expression` (over `self`) in CEL."""

    field: str  # the wire name of the field the message is about
    expression: str
    allows: Callable[[Any], bool]
    message: str

    def cel(self) -> dict[str, str]:
        return cel(self.expression, self.message, f".{self.field}")


def field_rule(rule: FieldRule) -> ObjectRule:
    """A FieldRule checked on the parsed object (an unset field passes), for `RULES`."""
    attribute = to_snake(rule.field)
    return ObjectRule(rule.field, rule.cel()["rule"],
                      lambda model: rule.allows(getattr(model, attribute)) if getattr(model, attribute) is not None
                      else True, rule.message)


def _schema_rules(schema: dict[str, Any], model: type) -> None:
    rules = [rule.cel() for rule in getattr(model, "RULES", ())]
    if rules:
        schema["x-kubernetes-validations"] = rules


class RuledModel(ApiModel):
    """An ApiModel whose `RULES` go into its schema (`x-kubernetes-validations`) and are enforced on parse."""

    model_config = ConfigDict(json_schema_extra=_schema_rules)
    RULES: ClassVar[tuple[ObjectRule, ...]] = ()

    @model_validator(mode="after")
    def _rules_hold(self):
        for rule in self.RULES:
            if not rule.allows(self):
                raise ValueError(rule.message)
        return self


def label_map_rule(field: str, reserved: tuple[str, ...] = ()) -> FieldRule:
    """Keys of a label (or annotation) map are label keys, outside the `reserved` prefixes. (The
    values' schema bounds them: CEL's cost estimate of a rule over an unbounded value is too high.)"""
    key_expr = f"size(k) <= {LABEL_KEY_MAX} && k.matches('{LABEL_KEY}')"
    key_expr += "".join(f" && !k.startsWith('{prefix}')" for prefix in reserved)

    def allows(mapping: dict[str, str]) -> bool:
        return all(len(k) <= LABEL_KEY_MAX and re.fullmatch(LABEL_KEY, k) and not k.startswith(reserved)
                   for k in mapping)

    what = "keys must be label keys"
    if reserved:
        what += f", not under {', '.join(reserved)} (set by embedjob and KubeRay)"
    return FieldRule(field, f"self.{field}.all(k, {key_expr})", allows, f"{field}: {what}")


def one_of(*sources: str, exactly: bool = True) -> ObjectRule:
    """Exactly one (or, not `exactly`, at most one) of the fields `sources` (wire names) is set."""
    count = " + ".join(f"(has(self.{name}) ? 1 : 0)" for name in sources)
    attributes = [to_snake(name) for name in sources]

    def allows(model: Any) -> bool:
        present = sum(getattr(model, name) is not None for name in attributes)
        return present == 1 if exactly else present <= 1

    return ObjectRule(sources[0], f"{count} {'==' if exactly else '<='} 1", allows,
                      f"set {'exactly' if exactly else 'at most'} one of {', '.join(sources)}")
