"""Where and as whom the Ray pods run: tolerations, affinity and security contexts, as Kubernetes spells them.

The shapes are the core/v1 ones (a subset of their fields), so that a manifest's
`tolerations` or `affinity` can be copied from any pod; what the API server would refuse
only when KubeRay creates the pods is refused here at apply time instead.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import Field

from .api_pod_rules import LABEL_KEY_MAX, MAX_LIST, MAX_MAP, ObjectRule, RuledModel, field_rule, \
    label_map_rule
from .api_rules import LABEL_KEY, LABEL_VALUE
from .api_base import DNS_LABEL, ApiModel

LabelKey = Annotated[str, Field(min_length=1, max_length=LABEL_KEY_MAX, pattern=LABEL_KEY)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]
# Pod and container user and group ids.
Id = Annotated[int, Field(ge=0, le=2_147_483_647)]


class TolerationOperator(str, Enum):
    Exists = "Exists"
    Equal = "Equal"


class TaintEffect(str, Enum):
    NoSchedule = "NoSchedule"
    PreferNoSchedule = "PreferNoSchedule"
    NoExecute = "NoExecute"


class Toleration(RuledModel):
    """A taint the pods tolerate (core/v1 Toleration), e.g. a GPU node pool's nvidia.com/gpu:NoSchedule."""

    RULES = (
        ObjectRule("operator", "has(self.key) || (has(self.operator) && self.operator == 'Exists')",
                   lambda t: t.key is not None or t.operator == "Exists",
                   "a toleration without a key must have operator Exists"),
        ObjectRule("value", "!has(self.value) || self.value == '' || !has(self.operator) || self.operator == 'Equal'",
                   lambda t: not t.value or t.operator != "Exists",
                   "a toleration with operator Exists must not have a value"),
        ObjectRule("tolerationSeconds",
                   "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                   lambda t: t.toleration_seconds is None or t.effect == "NoExecute",
                   "tolerationSeconds applies only to effect NoExecute"),
    )

    key: LabelKey | None = Field(None, description="The taint's key; unset with operator Exists: every taint.")
    operator: TolerationOperator | None = Field(None, description="Equal (key and value match; the default) or "
                                                "Exists (any value).")
    value: LabelValue | None = Field(None, description="The taint's value (operator Equal).")
    effect: TaintEffect | None = Field(None, description="NoSchedule, PreferNoSchedule or NoExecute; unset: all.")
    toleration_seconds: int | None = Field(None, ge=0, le=31_536_000, description="With NoExecute: how long the "
                                           "pod stays bound after the taint appears; unset: forever.")


class SelectorOperator(str, Enum):
    In = "In"
    NotIn = "NotIn"
    Exists = "Exists"
    DoesNotExist = "DoesNotExist"


class NodeSelectorOperator(str, Enum):
    In = "In"
    NotIn = "NotIn"
    Exists = "Exists"
    DoesNotExist = "DoesNotExist"
    Gt = "Gt"
    Lt = "Lt"


def _values_rule() -> ObjectRule:
    return ObjectRule(
        "values",
        "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0) && "
        "(!(self.operator in ['Gt', 'Lt']) || (has(self.values) && size(self.values) == 1 "
        "&& self.values[0].matches('^-?[0-9]+$')))",
        lambda r: (r.operator in ("In", "NotIn")) == bool(r.values) and (
            r.operator not in ("Gt", "Lt") or (len(r.values or ()) == 1 and r.values[0].lstrip("-").isdigit())),
        "values must be non-empty for In and NotIn, empty for Exists and DoesNotExist, one integer for Gt and Lt",
    )


class LabelSelectorRequirement(RuledModel):
    """One expression of a label selector."""

    RULES = (_values_rule(),)

    key: LabelKey = Field(description="The label key.")
    operator: SelectorOperator = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[LabelValue] | None = Field(None, max_length=MAX_LIST, description="Values for In and NotIn.")


class NodeSelectorRequirement(RuledModel):
    """One expression over a node's labels."""

    RULES = (_values_rule(),)

    key: LabelKey = Field(description="The node label key.")
    operator: NodeSelectorOperator = Field(description="In, NotIn, Exists, DoesNotExist, Gt or Lt.")
    values: list[LabelValue] | None = Field(None, max_length=MAX_LIST, description="Values for In and NotIn; one "
                                            "integer for Gt and Lt.")


class NodeSelectorTerm(ApiModel):
    """Node label expressions that must all hold."""

    match_expressions: list[NodeSelectorRequirement] | None = Field(None, max_length=16, description="Expressions "
                                                                    "over the node's labels, ANDed.")


class NodeSelector(ApiModel):
    """Terms of which a node must match one."""

    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1, max_length=16, description="Terms, ORed.")


class PreferredSchedulingTerm(ApiModel):
    """A weighted node preference."""

    weight: int = Field(ge=1, le=100, description="Weight, 1-100.")
    preference: NodeSelectorTerm = Field(description="The node term preferred.")


class NodeAffinity(ApiModel):
    """Nodes the pods must or should run on."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        None, description="Nodes the pods must run on.")
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = Field(
        None, max_length=16, description="Nodes the pods should run on, by weight.")


MATCH_LABELS_RULE = label_map_rule("matchLabels")


class LabelSelector(RuledModel):
    """Pods (or namespaces) selected by labels."""

    RULES = (field_rule(MATCH_LABELS_RULE),)

    match_labels: dict[str, LabelValue] | None = Field(None, max_length=MAX_MAP,
                                                description="Labels that must all match.")
    match_expressions: list[LabelSelectorRequirement] | None = Field(None, max_length=16, description="Label "
                                                                     "expressions, ANDed.")

class PodAffinityTerm(ApiModel):
    """Pods that must (not) run in the same topology domain (node, zone, ...)."""

    label_selector: LabelSelector | None = Field(None, description="The pods meant.")
    namespaces: list[Annotated[str, Field(max_length=63, pattern=DNS_LABEL)]] | None = Field(
        None, max_length=MAX_LIST, description="Namespaces of those pods; unset: the job's.")
    namespace_selector: LabelSelector | None = Field(None, description="Namespaces of those pods, by label.")
    topology_key: LabelKey = Field(description="The node label that defines the domain, e.g. kubernetes.io/hostname.")


class WeightedPodAffinityTerm(ApiModel):
    """A weighted pod (anti-)affinity preference."""

    weight: int = Field(ge=1, le=100, description="Weight, 1-100.")
    pod_affinity_term: PodAffinityTerm = Field(description="The term preferred.")


class PodAffinity(ApiModel):
    """Pods the Ray pods must or should (not) be placed with."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        None, max_length=16, description="Terms that must hold.")
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = Field(
        None, max_length=16, description="Terms that should hold, by weight.")


class Affinity(ApiModel):
    """Scheduling constraints (core/v1 Affinity)."""

    node_affinity: NodeAffinity | None = Field(None, description="Nodes the pods must or should run on.")
    pod_affinity: PodAffinity | None = Field(None, description="Pods these should run near.")
    pod_anti_affinity: PodAffinity | None = Field(None, description="Pods these should run apart from.")


class SeccompType(str, Enum):
    RuntimeDefault = "RuntimeDefault"
    Unconfined = "Unconfined"
    Localhost = "Localhost"


class SeccompProfile(RuledModel):
    """The seccomp profile."""

    RULES = (ObjectRule("localhostProfile", "(self.type == 'Localhost') == has(self.localhostProfile)",
                        lambda p: (p.type == "Localhost") == (p.localhost_profile is not None),
                        "localhostProfile is required with type Localhost and allowed only with it"),)

    type: SeccompType = Field(description="RuntimeDefault, Unconfined or Localhost.")
    localhost_profile: str | None = Field(None, min_length=1, max_length=256, pattern=r"^[^\x00/][^\x00]*$",
                                          description="With Localhost: the profile's path on the node, relative.")


class FsGroupChangePolicy(str, Enum):
    OnRootMismatch = "OnRootMismatch"
    Always = "Always"


class PodSecurityContext(ApiModel):
    """Pod-level security settings (core/v1 PodSecurityContext, a subset)."""

    run_as_user: Id | None = Field(None, description="UID of the containers' processes.")
    run_as_group: Id | None = Field(None, description="GID of the containers' processes.")
    run_as_non_root: bool | None = Field(None, description="Refuse to start a container that would run as root.")
    fs_group: Id | None = Field(None, description="Group that owns the pod's volumes.")
    fs_group_change_policy: FsGroupChangePolicy | None = Field(None, description="OnRootMismatch or Always.")
    supplemental_groups: list[Id] | None = Field(None, max_length=MAX_LIST, description="More groups of the "
                                                 "processes.")
    seccomp_profile: SeccompProfile | None = Field(None, description="The seccomp profile.")


class Capabilities(ApiModel):
    """Linux capabilities added and dropped."""

    add: list[Annotated[str, Field(max_length=64, pattern=r"^[A-Z_]+$")]] | None = Field(
        None, max_length=MAX_LIST, description="Capabilities added, e.g. SYS_PTRACE.")
    drop: list[Annotated[str, Field(max_length=64, pattern=r"^[A-Z_]+$")]] | None = Field(
        None, max_length=MAX_LIST, description="Capabilities dropped, e.g. ALL.")


class ContainerSecurityContext(ApiModel):
    """The Ray container's security settings (core/v1 SecurityContext, a subset)."""

    run_as_user: Id | None = Field(None, description="UID of the container's processes.")
    run_as_group: Id | None = Field(None, description="GID of the container's processes.")
    run_as_non_root: bool | None = Field(None, description="Refuse to start as root.")
    allow_privilege_escalation: bool | None = Field(None, description="Whether a process may gain privileges.")
    read_only_root_filesystem: bool | None = Field(None, description="Mount the root file system read-only (Ray "
                                                   "writes /tmp/ray: mount a volume there).")
    capabilities: Capabilities | None = Field(None, description="Capabilities added and dropped.")
    seccomp_profile: SeccompProfile | None = Field(None, description="The seccomp profile.")
