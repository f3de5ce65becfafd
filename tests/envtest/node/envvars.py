"""A container's environment, resolved as the kubelet does.

Order: service link variables (``enableServiceLinks``), then ``envFrom`` sources in
order, then ``env`` in order; a later name overrides an earlier one. ``$(NAME)``
references in ``env`` values, ``command`` and ``args`` expand to variables defined
before them (``$$`` is a literal ``$``; unknown references stay as written).
``valueFrom``: ``secretKeyRef``, ``configMapKeyRef`` (``optional`` honoured),
``fieldRef`` (metadata.name/namespace/uid, metadata.labels['k'] /
annotations['k'], spec.nodeName, spec.serviceAccountName, status.hostIP(s),
status.podIP(s)) and ``resourceFieldRef`` (cpu, memory, ephemeral-storage requests
and limits, with ``divisor``; an unset limit is the node's allocatable).
"""

from __future__ import annotations

import base64
import math
import re
from fractions import Fraction
from typing import Callable

_SUFFIX = {
    "": Fraction(1), "m": Fraction(1, 1000), "k": Fraction(10**3), "M": Fraction(10**6),
    "G": Fraction(10**9), "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[a-zA-Z]*)$")


def quantity(text: str | int | float) -> Fraction:
    """Parse a Kubernetes resource quantity ("500m", "2Gi", "1e3") exactly."""
    m = _QUANTITY.match(str(text).strip())
    if not m:
        raise ValueError(f"not a quantity: {text!r}")
    number, suffix = m.groups()
    if suffix[:1] in ("e", "E"):
        return Fraction(number) * Fraction(10) ** int(suffix[1:])
    if suffix not in _SUFFIX:
        raise ValueError(f"not a quantity: {text!r}")
    return Fraction(number) * _SUFFIX[suffix]


class EnvError(RuntimeError):
    """The kubelet's CreateContainerConfigError: a missing Secret/ConfigMap/key."""


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _REF.sub(sub, text)


_INDEXED = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_value(pod: dict, path: str) -> str:
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
    m = _INDEXED.match(path)
    if m:
        return meta.get(m.group(1), {}).get(m.group(2), "")
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.hostIPs": ",".join(i["ip"] for i in status.get("hostIPs", [])),
        "status.podIP": status.get("podIP", ""),
        "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs", [])),
    }
    if path not in simple:
        raise EnvError(f"unsupported fieldRef.fieldPath {path!r}")
    return simple[path]


def resource_value(container: dict, ref: dict, allocatable: dict[str, str]) -> str:
    resource = ref["resource"]  # e.g. limits.cpu, requests.memory
    kind, _, name = resource.partition(".")
    resources = container.get("resources", {})
    raw = resources.get(kind, {}).get(name)
    if raw is None:  # an unset limit is the node's allocatable; an unset request is 0
        raw = allocatable.get(name, "0") if kind == "limits" else "0"
    return str(math.ceil(quantity(raw) / quantity(ref.get("divisor") or "1")))


Lookup = Callable[[str, str], dict | None]  # (kind, name) -> Secret/ConfigMap in the pod's namespace, or None


def _key_ref(lookup: Lookup, kind: str, ref: dict) -> str | None:
    obj = lookup(kind, ref["name"])
    optional = ref.get("optional", False)
    if obj is None:
        if optional:
            return None
        raise EnvError(f'{kind.lower()} "{ref["name"]}" not found')
    key = ref["key"]
    if kind == "Secret":
        data = obj.get("data") or {}
        value = base64.b64decode(data[key]).decode() if key in data else None
    else:
        data = obj.get("data") or {}
        binary = obj.get("binaryData") or {}
        value = data.get(key) if key in data else (base64.b64decode(binary[key]).decode() if key in binary else None)
    if value is None and not optional:
        raise EnvError(f'couldn\'t find key {key} in {kind} {obj["metadata"]["namespace"]}/{ref["name"]}')
    return value


_VALID_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def resolve(pod: dict, container: dict, lookup: Lookup, base: dict[str, str],
            service_env: dict[str, str], allocatable: dict[str, str]) -> dict[str, str]:
    """The full environment of ``container`` (``base``: PATH, HOME, HOSTNAME; ``service_env``: service links)."""
    env = dict(base)
    if pod["spec"].get("enableServiceLinks", True):
        env.update(service_env)
    else:  # the master service's variables are always set
        env.update({k: v for k, v in service_env.items() if k.startswith("KUBERNETES_")})
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        for kind, field in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = source.get(field)
            if not ref:
                continue
            obj = lookup(kind, ref["name"])
            if obj is None:
                if ref.get("optional"):
                    continue
                raise EnvError(f'{kind.lower()} "{ref["name"]}" not found')
            items = dict(obj.get("data") or {})
            if kind == "Secret":
                items = {k: base64.b64decode(v).decode() for k, v in items.items()}
            for key, value in items.items():
                if _VALID_NAME.match(prefix + key):
                    env[prefix + key] = value
    defined: dict[str, str] = {}
    for var in container.get("env", []):
        name = var["name"]
        if "valueFrom" not in var:
            value = expand(var.get("value", ""), {**env, **defined})
        else:
            src = var["valueFrom"]
            if "secretKeyRef" in src:
                value = _key_ref(lookup, "Secret", src["secretKeyRef"])
            elif "configMapKeyRef" in src:
                value = _key_ref(lookup, "ConfigMap", src["configMapKeyRef"])
            elif "fieldRef" in src:
                value = field_value(pod, src["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in src:
                value = resource_value(container, src["resourceFieldRef"], allocatable)
            else:
                raise EnvError(f"env {name}: unsupported valueFrom {sorted(src)}")
            if value is None:  # optional and missing: not set
                continue
        defined[name] = value
        env[name] = value
    return env


def service_links(services: list[dict], namespace: str) -> dict[str, str]:
    """``<NAME>_SERVICE_HOST``/``_SERVICE_PORT``/``_SERVICE_PORT_<PORT>`` for the namespace's
    services with a cluster IP, and the master service ``kubernetes`` of ``default``."""
    env: dict[str, str] = {}
    for svc in services:
        meta, spec = svc["metadata"], svc.get("spec", {})
        if meta.get("namespace") != namespace and not (meta.get("namespace") == "default" and meta["name"] == "kubernetes"):
            continue
        cluster_ip = spec.get("clusterIP")
        if not cluster_ip or cluster_ip == "None" or not spec.get("ports"):
            continue
        name = meta["name"].upper().replace("-", "_")
        env[f"{name}_SERVICE_HOST"] = cluster_ip
        env[f"{name}_SERVICE_PORT"] = str(spec["ports"][0]["port"])
        for port in spec["ports"]:
            if port.get("name"):
                env[f"{name}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(port["port"])
            proto = port.get("protocol", "TCP")
            env[f"{name}_PORT"] = env.get(f"{name}_PORT", f"{proto.lower()}://{cluster_ip}:{spec['ports'][0]['port']}")
            prefix = f"{name}_PORT_{port['port']}_{proto}"
            env[prefix] = f"{proto.lower()}://{cluster_ip}:{port['port']}"
            env[f"{prefix}_PROTO"] = proto.lower()
            env[f"{prefix}_PORT"] = str(port["port"])
            env[f"{prefix}_ADDR"] = cluster_ip
    return env
