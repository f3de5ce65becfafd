"""Spec rules the schema's bounds cannot say: each one a CEL rule for the CRD and the same check for `parse_spec`.

`kubectl apply` rejects a manifest by the CEL rule (`x-kubernetes-validations` next to
the field); `embedjob run` and the operator reject the same spec through the pydantic
validator that calls `FieldRule.enforce`. One message serves both, and names the field.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

# The driver's bookkeeping tables (embedjob_runs, embedjob_batches, ...) and Alembic's;
# a vectors table of such a name would be written into them.
RESERVED_TABLE_PREFIX = "embedjob_"
RESERVED_TABLES = ("alembic_version",)
# No leading or trailing white space, not blank.
NOT_BLANK = r"^\S(.*\S)?$"
# A model directory the driver would hash whole: the file system root, a system
# directory, the working directory or the home directory. (Character classes instead
# of backslashes: the same pattern goes into a CEL string.)
SYSTEM_ROOT = (r"^(/+|/+(bin|boot|dev|etc|home|lib|lib64|mnt|opt|proc|root|run|sbin|srv|sys|tmp|usr|var)/*"
               r"|[.]{1,2}/*|~/*)$")
# Kubernetes label keys (an optional DNS-subdomain prefix and a name) and values.
LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
# Kubernetes CPU quantities have millicore resolution: a smaller step rounds away.
CPU_STEP = 0.001
# A fractional GPU is shared by at most this many actors (all in one pod).
MAX_ACTORS_PER_GPU = 16
MIN_GPU_SHARE = 1 / MAX_ACTORS_PER_GPU


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry."""
    validation = {"rule": rule, "message": message}
    if field_path:
        validation["fieldPath"] = field_path
    return validation


@dataclass(frozen=True)
class FieldRule:
    """A rule on one optional field of an object: `allows(value)` in Python, `expression` in CEL."""

    field: str  # the wire (camelCase) name
    expression: str  # CEL over `self.<field>`, evaluated only when the field is set
    allows: Callable[[Any], bool]
    message: str

    def cel(self) -> dict[str, str]:
        return cel(f"!has(self.{self.field}) || ({self.expression})", self.message, f".{self.field}")

    def enforce(self, value: Any) -> Any:
        if value is not None and not self.allows(value):
            raise ValueError(self.message)
        return value


def ray_quantity(field: str) -> FieldRule:
    """Ray accepts fractional resource quantities only below 1 ("Resource quantities >1
    must be whole numbers")."""
    return FieldRule(
        field, f"self.{field} <= 1.0 || self.{field} == double(int(self.{field}))",
        lambda value: value <= 1 or value == int(value),
        f"{field} above 1 must be a whole number (Ray allows fractions only below 1)",
    )


_MILLIS = "self.cpusPerActor * 1000.0"
_OFF = f"(double(int({_MILLIS} + 0.5)) - {_MILLIS})"
CPU_STEP_RULE = FieldRule(
    "cpusPerActor", f"{_OFF} < 0.000001 && {_OFF} > -0.000001",
    lambda cpus: math.isclose(cpus * 1000, round(cpus * 1000), abs_tol=1e-6),
    f"cpusPerActor must be a multiple of {CPU_STEP} (Kubernetes CPU quantities are millicores)",
)
GPU_SHARE_RULE = FieldRule(
    "gpusPerActor", f"self.gpusPerActor == 0.0 || self.gpusPerActor >= {MIN_GPU_SHARE}",
    lambda gpus: gpus == 0 or gpus >= MIN_GPU_SHARE,
    f"gpusPerActor below 1 must be at least {MIN_GPU_SHARE} (at most {MAX_ACTORS_PER_GPU} actors share one GPU)",
)
TABLE_RULE = FieldRule(
    "table", f"!(self.table.startsWith('{RESERVED_TABLE_PREFIX}') || self.table in {list(RESERVED_TABLES)})",
    lambda table: not (table.startswith(RESERVED_TABLE_PREFIX) or table in RESERVED_TABLES),
    f"table must not be one of embedjob's own tables ({RESERVED_TABLE_PREFIX}*, {', '.join(RESERVED_TABLES)})",
)
MODEL_PATH_RULE = FieldRule(
    "path", f"!self.path.matches('{SYSTEM_ROOT}')",
    lambda path: re.fullmatch(SYSTEM_ROOT, path) is None,
    "path must name the model's own directory, not /, a system directory, . or ~",
)
