"""A pod's volumes, made into directories on the host before its containers start.

- ``emptyDir``: a directory in the pod's directory; ``medium: Memory`` one under
  /dev/shm (a tmpfs), named with the run's prefix so a sweep finds it.
- ``secret``, ``configMap``, ``downwardAPI``, ``projected`` (secret, configMap,
  downwardAPI, serviceAccountToken): files written once when the pod starts
  (``items``, ``defaultMode`` and per-item ``mode`` honoured). Unlike a kubelet,
  later changes of the Secret/ConfigMap and token expiry are not followed: a pod
  here lives minutes, a token an hour.
- ``hostPath``: the host path itself (created for ``DirectoryOrCreate``/``FileOrCreate``).
Anything else (persistentVolumeClaim, ephemeral, csi, ...) is refused by name.

Mounting them at their ``mountPath`` inside a container is launcher.py's job.
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path
from typing import Callable

from .envvars import EnvError, field_value, resource_value

Lookup = Callable[[str, str], dict | None]
TokenRequest = Callable[[str, list[str], int], str]  # (serviceaccount, audiences, seconds) -> token


class VolumeError(RuntimeError):
    pass


def _decoded(obj: dict, kind: str) -> dict[str, bytes]:
    data = {k: (base64.b64decode(v) if kind == "Secret" else v.encode()) for k, v in (obj.get("data") or {}).items()}
    if kind == "ConfigMap":
        data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def _write(root: Path, rel: str, content: bytes, mode: int) -> None:
    path = (root / rel).resolve()
    if root.resolve() not in path.parents:
        raise VolumeError(f"volume item path {rel!r} leaves the volume")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.chmod(mode)


def _key_files(root: Path, lookup: Lookup, kind: str, source: dict, default_mode: int) -> None:
    name = source.get("name") or source.get("secretName")
    obj = lookup(kind, name)
    if obj is None:
        if source.get("optional"):
            return
        raise VolumeError(f'{kind.lower()} "{name}" not found')
    data = _decoded(obj, kind)
    items = source.get("items")
    if not items:
        items = [{"key": k, "path": k} for k in data]
    for item in items:
        if item["key"] not in data:
            if source.get("optional"):
                continue
            raise VolumeError(f'{kind.lower()} "{name}": no key {item["key"]!r}')
        _write(root, item["path"], data[item["key"]], item.get("mode", default_mode))


def _downward_files(root: Path, pod: dict, items: list[dict], default_mode: int,
                    allocatable: dict[str, str]) -> None:
    for item in items:
        if "fieldRef" in item:
            path = item["fieldRef"]["fieldPath"]
            if path in ("metadata.labels", "metadata.annotations"):
                kv = pod["metadata"].get(path.split(".")[1], {})
                text = "\n".join(f'{k}="{v}"' for k, v in sorted(kv.items()))
            else:
                text = field_value(pod, path)
        else:
            ref = item["resourceFieldRef"]
            container = next(c for c in pod["spec"]["containers"] if c["name"] == ref.get("containerName"))
            text = resource_value(container, ref, allocatable)
        _write(root, item["path"], text.encode(), item.get("mode", default_mode))


def prepare(pod: dict, pod_dir: Path, shm_dir: Callable[[str], Path], lookup: Lookup,
            token: TokenRequest, allocatable: dict[str, str]) -> dict[str, Path]:
    """Create every volume of ``pod``; returns {volume name: host path}."""
    paths: dict[str, Path] = {}
    for vol in pod["spec"].get("volumes", []):
        name = vol["name"]
        if "hostPath" in vol:
            hp = vol["hostPath"]
            path = Path(hp["path"])
            if hp.get("type") == "DirectoryOrCreate":
                path.mkdir(parents=True, exist_ok=True)
            elif hp.get("type") == "FileOrCreate" and not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            paths[name] = path
            continue
        if "emptyDir" in vol and (vol["emptyDir"] or {}).get("medium") == "Memory":
            root = shm_dir(name)
        else:
            root = pod_dir / "volumes" / name
        root.mkdir(parents=True, exist_ok=True)
        paths[name] = root
        try:
            if "emptyDir" in vol:
                root.chmod(0o777)
            elif "secret" in vol:
                src = vol["secret"]
                _key_files(root, lookup, "Secret", src, src.get("defaultMode", 0o644))
            elif "configMap" in vol:
                src = vol["configMap"]
                _key_files(root, lookup, "ConfigMap", src, src.get("defaultMode", 0o644))
            elif "downwardAPI" in vol:
                src = vol["downwardAPI"]
                _downward_files(root, pod, src.get("items", []), src.get("defaultMode", 0o644), allocatable)
            elif "projected" in vol:
                src = vol["projected"]
                mode = src.get("defaultMode", 0o644)
                for part in src.get("sources", []):
                    if "serviceAccountToken" in part:
                        t = part["serviceAccountToken"]
                        aud = [t["audience"]] if t.get("audience") else []
                        value = token(pod["spec"].get("serviceAccountName", "default"), aud,
                                      int(t.get("expirationSeconds", 3600)))
                        _write(root, t["path"], value.encode(), 0o600 if "defaultMode" not in src else mode)
                    elif "secret" in part:
                        _key_files(root, lookup, "Secret", part["secret"], mode)
                    elif "configMap" in part:
                        _key_files(root, lookup, "ConfigMap", part["configMap"], mode)
                    elif "downwardAPI" in part:
                        _downward_files(root, pod, part["downwardAPI"].get("items", []), mode, allocatable)
                    else:
                        raise VolumeError(f"projected volume {name}: unsupported source {sorted(part)}")
            else:
                kinds = sorted(k for k in vol if k != "name")
                raise VolumeError(f"volume {name}: unsupported on the test node: {kinds}")
        except EnvError as exc:
            raise VolumeError(f"volume {name}: {exc}") from exc
    return paths


def remove(pod_dir: Path, memory_dirs: list[Path]) -> None:
    for path in memory_dirs:
        shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(pod_dir / "volumes", ignore_errors=True)


def mount_source(volumes: dict[str, Path], mount: dict) -> Path:
    """Host path to bind at ``mount["mountPath"]`` (``subPath``/``subPathExpr`` already expanded)."""
    if mount["name"] not in volumes:
        raise VolumeError(f'volumeMount {mount["mountPath"]}: no volume named {mount["name"]!r}')
    src = volumes[mount["name"]]
    sub = mount.get("subPath")
    if sub:
        src = (src / sub)
        if os.path.isabs(sub) or ".." in Path(sub).parts:
            raise VolumeError(f"subPath {sub!r} must be relative and stay inside the volume")
        if not src.exists():
            src.mkdir(parents=True, exist_ok=True)  # as the kubelet does for a missing subPath
    return src
