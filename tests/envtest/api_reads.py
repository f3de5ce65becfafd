"""Reads of the test API server from the test process: what `kubectl get -o json` prints, without a kubectl process.

The tests poll the API server several times a second while they wait (`support.polling`). Each
kubectl run costs about 80 ms of CPU for its start alone, and process accounting of a cluster-tier
run (2026-12-06) found kubectl at 16% of the tier's CPU (2,750 runs in 15 minutes). A GET with the
admin client certificate costs a few milliseconds. Only plain reads are served here (a resource by
any name kubectl takes for it, an optional object name, namespace and label selector); everything a
user would type stays a real kubectl.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass


class ReadFailed(Exception):
    """The API server did not give the object: `status` is its HTTP status (None: no answer), `message` what kubectl
    would print for it."""

    def __init__(self, status: int | None, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class Resource:
    path: str  #: /api/v1/pods, /apis/ray.io/v1/rayjobs
    namespaced: bool
    kind: str
    api_version: str


def _as_kubectl_prints(obj: dict) -> dict:
    """The object without its managedFields, which kubectl leaves out unless asked (--show-managed-fields)."""
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


class ApiReads:
    """GETs against one API server with one TLS context; the resources' paths from its discovery documents."""

    def __init__(self, server: str, tls: ssl.SSLContext):
        self._server, self._tls = server, tls
        self._lock = threading.Lock()
        self._by_name: dict[str, Resource] | None = None

    def get(self, resource: str, name: str | None = None, namespace: str = "default",
            selector: str | None = None) -> dict:
        """The object, or the list (`items`, each with its apiVersion and kind, as kubectl prints them)."""
        found = self._resource(resource)
        base = found.path
        if found.namespaced:
            prefix, plural = base.rsplit("/", 1)
            base = f"{prefix}/namespaces/{urllib.parse.quote(namespace, safe='')}/{plural}"
        if name is not None:
            return _as_kubectl_prints(self._get_json(f"{base}/{urllib.parse.quote(name, safe='')}",
                                                     f'{resource} "{name}"'))
        query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        listed = self._get_json(base + query, resource)
        for item in listed.get("items") or []:
            item.setdefault("apiVersion", found.api_version)
            item.setdefault("kind", found.kind)
            _as_kubectl_prints(item)
        return listed

    def _resource(self, resource: str) -> Resource:
        key = resource.lower()
        with self._lock:
            if self._by_name is None or key not in self._by_name:  # new CRDs since the last look
                self._by_name = self._discover()
            if key not in self._by_name:
                raise ReadFailed(None, f'error: the server doesn\'t have a resource type "{resource}"')
            return self._by_name[key]

    def _discover(self) -> dict[str, Resource]:
        """Every name kubectl takes for a resource (plural, singular, short names, kind; each also as name.group);
        the core group first, then the groups in the server's order, as kubectl prefers them (e.g. `events`)."""
        versions = [("", version) for version in self._get_json("/api", "/api")["versions"]]
        versions += [(group["name"], group["preferredVersion"]["groupVersion"])
                     for group in self._get_json("/apis", "/apis")["groups"]]
        names: dict[str, Resource] = {}
        for group, group_version in versions:
            path = f"/api/{group_version}" if not group else f"/apis/{group_version}"
            for item in self._get_json(path, path)["resources"]:
                if "/" in item["name"]:
                    continue  # a subresource (pods/log, ...)
                found = Resource(f"{path}/{item['name']}", item["namespaced"], item["kind"], group_version)
                for alias in {item["name"], item.get("singularName") or "", item["kind"].lower(),
                              *item.get("shortNames", [])} - {""}:
                    names.setdefault(alias, found)
                    if group:
                        names.setdefault(f"{alias}.{group}", found)
        return names

    def _get_json(self, path: str, what: str, attempts: int = 10) -> dict:
        try:
            with urllib.request.urlopen(self._server + path, context=self._tls, timeout=30) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as exc:  # kubectl's words for the server's Status, e.g. a 503 while it starts
            if (exc.code == 429 or exc.code >= 500) and exc.headers.get("Retry-After") and attempts > 1:
                # client-go's rule: a 429 or 5xx that says when to come back is tried again, up to 10 times
                time.sleep(1.0 if not exc.headers["Retry-After"].isdigit() else min(int(exc.headers["Retry-After"]), 1))
                return self._get_json(path, what, attempts - 1)
            try:
                status = json.loads(exc.read())
            except ValueError:
                status = {}
            raise ReadFailed(exc.code, f"Error from server ({status.get('reason') or exc.code}): "
                                       f"{status.get('message') or what}") from None
        except (OSError, http.client.HTTPException) as exc:  # down or restarting: kubectl's words, as the
            # stand-in's retries (plugins.standin.unreachable) look for them
            raise ReadFailed(None, f"The connection to the server {self._server} was refused: {exc}") from None
