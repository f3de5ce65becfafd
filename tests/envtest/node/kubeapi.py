"""A small Kubernetes REST client for the test node: requests and watches, from a kubeconfig.

Only what the node agent needs: JSON in and out, client-certificate or token
authentication, a CA, list + watch with resourceVersion and relist on 410 Gone.
One HTTPS connection per request (the agent makes few), one per watch.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Callable, Iterator

import yaml


class ApiError(Exception):
    def __init__(self, status: int, body: str, method: str = "", path: str = ""):
        self.status = status
        self.body = body
        try:
            self.reason = json.loads(body).get("reason", "")
        except ValueError:
            self.reason = ""
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")


class Client:
    """Talks to the API server named in ``kubeconfig`` (its current context)."""

    def __init__(self, kubeconfig: str | os.PathLike):
        config = yaml.safe_load(Path(kubeconfig).read_text())
        ctx_name = config["current-context"]
        ctx = next(c["context"] for c in config["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == ctx["user"])
        url = urllib.parse.urlsplit(cluster["server"])
        self.host, self.port = url.hostname, url.port or 443
        self.ssl = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        self.headers = {"Accept": "application/json"}
        if "token" in user:
            self.headers["Authorization"] = f"Bearer {user['token']}"
        if "client-certificate-data" in user:
            # ssl wants files; they live only as long as loading them takes
            with tempfile.TemporaryDirectory(prefix="ejn-kubeapi-") as tmp:
                crt, key = Path(tmp, "c.crt"), Path(tmp, "c.key")
                crt.write_bytes(base64.b64decode(user["client-certificate-data"]))
                key.write_bytes(base64.b64decode(user["client-key-data"]))
                self.ssl.load_cert_chain(str(crt), str(key))

    def _connect(self, timeout: float | None) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ssl, timeout=timeout)

    def request(self, method: str, path: str, body=None, *, params: dict | None = None,
                content_type: str = "application/json", timeout: float = 30):
        """One request; returns the decoded JSON body (None when empty); raises ApiError."""
        if params:
            path = f"{path}?{urllib.parse.urlencode(params)}"
        data = None if body is None else (body if isinstance(body, (bytes, str)) else json.dumps(body))
        headers = dict(self.headers)
        if data is not None:
            headers["Content-Type"] = content_type
        conn = self._connect(timeout)
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            text = resp.read().decode()
        finally:
            conn.close()
        if resp.status >= 300:
            raise ApiError(resp.status, text, method, path)
        return json.loads(text) if text else None

    def get(self, path: str, **kw):
        return self.request("GET", path, **kw)

    def create(self, path: str, body, **kw):
        return self.request("POST", path, body, **kw)

    def patch(self, path: str, body, *, strategic: bool = False, **kw):
        kind = "strategic-merge-patch" if strategic else "merge-patch"
        return self.request("PATCH", path, body, content_type=f"application/{kind}+json", **kw)

    def delete(self, path: str, body=None, **kw):
        return self.request("DELETE", path, body, **kw)

    def watch(self, path: str, params: dict, timeout_seconds: int = 300) -> Iterator[dict]:
        """Stream watch events ({"type", "object"}) until the server closes the watch."""
        query = {**params, "watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_seconds)}
        conn = self._connect(timeout_seconds + 30)
        try:
            conn.request("GET", f"{path}?{urllib.parse.urlencode(query)}", headers=self.headers)
            resp = conn.getresponse()
            if resp.status >= 300:
                raise ApiError(resp.status, resp.read().decode(), "WATCH", path)
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()


class Informer:
    """List + watch one collection into a dict {"ns/name": object}; calls ``on_change`` after each change.

    Runs in its own daemon thread; relists after a 410 Gone or any error.
    """

    def __init__(self, client: Client, path: str, on_change: Callable[["Informer"], None] | None = None,
                 params: dict | None = None, name: str = ""):
        self.client, self.path, self.params = client, path, dict(params or {})
        self.on_change = on_change or (lambda informer: None)
        self.items: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"informer-{name or path}", daemon=True)

    @staticmethod
    def key(obj: dict) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace', '')}/{meta['name']}"

    def start(self) -> "Informer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.items.values())

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                listed = self.client.get(self.path, params=self.params)
                with self.lock:
                    self.items = {self.key(o): o for o in listed.get("items", [])}
                self.synced.set()
                self.on_change(self)
                rv = listed["metadata"]["resourceVersion"]
                while not self.stopped.is_set():
                    for event in self.client.watch(self.path, {**self.params, "resourceVersion": rv}):
                        kind, obj = event["type"], event["object"]
                        if kind == "ERROR":
                            raise ApiError(obj.get("code", 500), json.dumps(obj), "WATCH", self.path)
                        rv = obj["metadata"]["resourceVersion"]
                        if kind == "BOOKMARK":
                            continue
                        with self.lock:
                            if kind == "DELETED":
                                self.items.pop(self.key(obj), None)
                            else:
                                self.items[self.key(obj)] = obj
                        self.on_change(self)
                        if self.stopped.is_set():
                            return
            except Exception:  # noqa: BLE001 - relist after any failure (410 Gone included)
                if self.stopped.wait(1.0):
                    return


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def now_micro() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"
