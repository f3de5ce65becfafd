"""What the Ray container sees: volumes and their mounts, extra env and envFrom, resources (core/v1 shapes, a subset).

Env names the driver and KubeRay rely on are refused here: `EMBEDJOB_*` (the database
URL from the job's Secret and every other variable of `embedjob.contract`) and the Ray
connection and auth variables KubeRay sets; so are the volume names KubeRay adds.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated

from pydantic import Field

from .api_base import DNS_LABEL, DNS_SUBDOMAIN, SECRET_KEY, ApiModel
from .api_pod_rules import MAX_LIST, MAX_MAP, NO_NUL, QUANTITY, ObjectRule, RuledModel, field_rule, \
    one_of, quantity_value
from .api_rules import FieldRule

# Every variable of embedjob.contract starts so (a unit test holds them to it).
RESERVED_ENV_PREFIX = "EMBEDJOB_"
# What KubeRay sets for Ray to find and join its cluster (ray-operator common/pod.go).
RESERVED_ENV_NAMES = ("RAY_ADDRESS", "RAY_IP", "FQ_RAY_IP", "RAY_PORT", "RAY_CLUSTER_NAME", "RAY_CLUSTER_NAMESPACE",
                      "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "KUBERAY_GEN_RAY_START_CMD")
# Volumes KubeRay adds to every Ray pod (the auth token, /dev/shm).
RESERVED_VOLUMES = ("ray-token", "shared-mem")
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
ABSOLUTE_PATH = r"^/[^\x00:]*$"
# Relative, no NUL; '..' is refused by a rule.
RELATIVE_PATH = r"^[^\x00/][^\x00]*$"

DnsName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
VolumeName = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)]
Quantity = Annotated[str, Field(max_length=64, pattern=QUANTITY)]
FileMode = Annotated[int, Field(ge=0, le=0o777)]


def _not_reserved(name: str) -> bool:
    return not (name.startswith(RESERVED_ENV_PREFIX) or name in RESERVED_ENV_NAMES)


_RESERVED_CEL = f"self.name.startsWith('{RESERVED_ENV_PREFIX}') || self.name in {list(RESERVED_ENV_NAMES)}"
ENV_NAME_RULE = FieldRule(
    "name", f"!({_RESERVED_CEL})", _not_reserved,
    f"env name is set by embedjob or KubeRay and cannot be overridden ({RESERVED_ENV_PREFIX}*, "
    f"{', '.join(RESERVED_ENV_NAMES)})",
)
ENV_PREFIX_RULE = FieldRule(
    "prefix", f"!self.prefix.startsWith('{RESERVED_ENV_PREFIX}')",
    lambda prefix: not prefix.startswith(RESERVED_ENV_PREFIX),
    f"envFrom prefix must not start with {RESERVED_ENV_PREFIX} (embedjob's own variables)",
)
VOLUME_NAME_RULE = FieldRule(
    "name", f"!(self.name in {list(RESERVED_VOLUMES)})", lambda name: name not in RESERVED_VOLUMES,
    f"volume name is one KubeRay adds ({', '.join(RESERVED_VOLUMES)})",
)
SUB_PATH_RULE = FieldRule(
    "subPath", "!self.subPath.split('/').exists(p, p == '..')",
    lambda path: ".." not in path.split("/"), "subPath must not contain '..'",
)


class KeySelector(ApiModel):
    """A key of a Secret or ConfigMap in the job's namespace."""

    name: DnsName = Field(description="The Secret's or ConfigMap's name.")
    key: str = Field(min_length=1, max_length=253, pattern=SECRET_KEY, description="The key.")
    optional: bool | None = Field(None, description="Whether the key may be missing.")


class FieldSelector(ApiModel):
    """A field of the pod (metadata.name, spec.nodeName, status.podIP, ...)."""

    field_path: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_.\[\]'/-]+$",
                            description="The pod's field, e.g. spec.nodeName.")


class EnvSource(RuledModel):
    """Where a variable's value comes from: a Secret key, a ConfigMap key or a pod field."""

    RULES = (one_of("secretKeyRef", "configMapKeyRef", "fieldRef"),)

    secret_key_ref: KeySelector | None = Field(None, description="A key of a Secret.")
    config_map_key_ref: KeySelector | None = Field(None, description="A key of a ConfigMap.")
    field_ref: FieldSelector | None = Field(None, description="A field of the pod.")


class EnvVar(RuledModel):
    """An extra environment variable of the Ray container; merged by name."""

    RULES = (one_of("value", "valueFrom", exactly=False), field_rule(ENV_NAME_RULE))

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME,
                      description=f"The name; not {RESERVED_ENV_PREFIX}* nor one KubeRay sets for Ray.")
    value: str | None = Field(None, max_length=4096, pattern=NO_NUL, description="The value (at most 4096 "
                              "characters; larger values belong in a Secret or ConfigMap).")
    value_from: EnvSource | None = Field(None, description="Where the value comes from instead.")


class ObjectRef(ApiModel):
    """A Secret or ConfigMap in the job's namespace."""

    name: DnsName = Field(description="Its name.")
    optional: bool | None = Field(None, description="Whether it may be missing.")


class EnvFromSource(RuledModel):
    """Every key of a Secret or ConfigMap as a variable (e.g. object-store credentials). A variable set in `env`,
    ours included, wins over one from here."""

    RULES = (one_of("secretRef", "configMapRef"), field_rule(ENV_PREFIX_RULE))

    prefix: str | None = Field(None, max_length=128, pattern=ENV_NAME, description="Prepended to every key.")
    secret_ref: ObjectRef | None = Field(None, description="The Secret.")
    config_map_ref: ObjectRef | None = Field(None, description="The ConfigMap.")


class VolumeMount(RuledModel):
    """A volume of the pod mounted into the Ray container; merged by mountPath."""

    RULES = (field_rule(SUB_PATH_RULE),)

    name: VolumeName = Field(description="The volume's name (in this template's volumes).")
    mount_path: str = Field(min_length=1, max_length=1024, pattern=ABSOLUTE_PATH,
                            description="Where, an absolute path without ':'.")
    sub_path: str | None = Field(None, max_length=1024, pattern=RELATIVE_PATH,
                                 description="A path inside the volume to mount instead of its root.")
    read_only: bool | None = Field(None, description="Mount read-only.")


class KeyToPath(ApiModel):
    """A key of a Secret or ConfigMap projected to a file."""

    key: str = Field(min_length=1, max_length=253, pattern=SECRET_KEY, description="The key.")
    path: str = Field(min_length=1, max_length=1024, pattern=RELATIVE_PATH, description="The file, relative.")
    mode: FileMode | None = Field(None, description="The file's mode bits.")


class StorageMedium(str, Enum):
    default = ""
    Memory = "Memory"


class EmptyDirSource(ApiModel):
    """A scratch directory that lives as long as the pod (e.g. a model cache)."""

    medium: StorageMedium | None = Field(None, description="'' (the node's disk) or Memory.")
    size_limit: Quantity | None = Field(None, description="Its size limit, a quantity.")


class ConfigMapSource(ApiModel):
    """A ConfigMap's keys as files."""

    name: DnsName = Field(description="The ConfigMap.")
    items: list[KeyToPath] | None = Field(None, max_length=MAX_LIST, description="Keys to project; unset: all.")
    default_mode: FileMode | None = Field(None, description="Mode bits of the files.")
    optional: bool | None = Field(None, description="Whether it may be missing.")


class SecretSource(ApiModel):
    """A Secret's keys as files."""

    secret_name: DnsName = Field(description="The Secret.")
    items: list[KeyToPath] | None = Field(None, max_length=MAX_LIST, description="Keys to project; unset: all.")
    default_mode: FileMode | None = Field(None, description="Mode bits of the files.")
    optional: bool | None = Field(None, description="Whether it may be missing.")


class ClaimSource(ApiModel):
    """A PersistentVolumeClaim in the job's namespace."""

    claim_name: DnsName = Field(description="The claim.")
    read_only: bool | None = Field(None, description="Mount read-only.")


class HostPathSource(ApiModel):
    """A directory of the node."""

    path: str = Field(min_length=1, max_length=1024, pattern=ABSOLUTE_PATH, description="The node's path.")
    type: str | None = Field(None, pattern=r"^(|DirectoryOrCreate|Directory|FileOrCreate|File|Socket|CharDevice|"
                             r"BlockDevice)$", description="What must be there (core/v1 HostPathType).")


class NfsSource(ApiModel):
    """An NFS export."""

    server: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9.:\[\]-]+$", description="The server.")
    path: str = Field(min_length=1, max_length=1024, pattern=ABSOLUTE_PATH, description="The exported path.")
    read_only: bool | None = Field(None, description="Mount read-only.")


class CsiSource(ApiModel):
    """A volume of a CSI driver (e.g. a secrets store or an object-store mount)."""

    driver: DnsName = Field(description="The CSI driver's name.")
    read_only: bool | None = Field(None, description="Mount read-only.")
    fs_type: str | None = Field(None, max_length=32, pattern=r"^[a-z0-9]+$", description="File system type.")
    volume_attributes: dict[str, Annotated[str, Field(max_length=4096, pattern=NO_NUL)]] | None = Field(
        None, max_length=MAX_MAP, description="Driver-specific attributes.")
    node_publish_secret_ref: ObjectRef | None = Field(None, description="A Secret the driver is given.")


VOLUME_SOURCES = ("emptyDir", "configMap", "secret", "persistentVolumeClaim", "hostPath", "nfs", "csi")


class Volume(RuledModel):
    """A volume of the pod (core/v1 Volume, the sources listed); merged by name."""

    RULES = (one_of(*VOLUME_SOURCES), field_rule(VOLUME_NAME_RULE))

    name: VolumeName = Field(description="The volume's name, a DNS label; not ray-token or shared-mem (KubeRay's).")
    empty_dir: EmptyDirSource | None = Field(None, description="A scratch directory.")
    config_map: ConfigMapSource | None = Field(None, description="A ConfigMap's keys as files.")
    secret: SecretSource | None = Field(None, description="A Secret's keys as files.")
    persistent_volume_claim: ClaimSource | None = Field(None, description="A PersistentVolumeClaim.")
    host_path: HostPathSource | None = Field(None, description="A directory of the node.")
    nfs: NfsSource | None = Field(None, description="An NFS export.")
    csi: CsiSource | None = Field(None, description="A CSI driver's volume.")


RESOURCE_NAME = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$"
_NAMES_CEL = " && ".join(f"(!has(self.{kind}) || self.{kind}.all(k, size(k) <= 253 && k.matches('{RESOURCE_NAME}')))"
                         for kind in ("requests", "limits"))
_WITHIN_CEL = ("!has(self.requests) || !has(self.limits) || self.limits.all(k, !(k in self.requests) || "
               "quantity(self.requests[k]).compareTo(quantity(self.limits[k])) <= 0)")


def _within_limits(resources: "Resources") -> bool:
    requests, limits = resources.requests or {}, resources.limits or {}
    return all(quantity_value(requests[k]) <= quantity_value(v) for k, v in limits.items() if k in requests)


class Resources(RuledModel):
    """The head container's requests and limits; given, they replace the operator's default as a whole."""

    RULES = (
        ObjectRule("requests", _NAMES_CEL,
                   lambda r: all(len(k) <= 253 and re.fullmatch(RESOURCE_NAME, k)
                                 for k in {**(r.requests or {}), **(r.limits or {})}),
                   "resource names must be like cpu, memory or nvidia.com/gpu"),
        ObjectRule("requests", _WITHIN_CEL, _within_limits, "a request must not exceed its limit"),
    )

    requests: dict[str, Quantity] | None = Field(None, max_length=16,
                                                 description="Requests, e.g. {cpu: '2', memory: 8Gi}.")
    limits: dict[str, Quantity] | None = Field(None, max_length=16,
                                               description="Limits, e.g. {memory: 8Gi}.")
