"""A throwaway certificate authority (openssl CLI, P-256 keys) and kubeconfigs that embed its certificates."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path
from typing import Iterable, Sequence


def openssl(*args: str, cwd: Path) -> None:
    res = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{res.stderr}")


def subject_of(common_name: str, organizations: Iterable[str] = ()) -> str:
    """An X.509 subject: Kubernetes reads CN as the user name and each O as a group."""
    def esc(v: str) -> str:
        return re.sub(r"([/=+,\\])", r"\\\1", v)

    return "".join(f"/O={esc(o)}" for o in organizations) + f"/CN={esc(common_name)}"


class CA:
    """A throwaway certificate authority in `directory`."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cert = self.dir / "ca.crt"
        self.key = self.dir / "ca.key"
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", str(self.key), "-out", str(self.cert), "-days", "3650",
                "-subj", "/CN=embedjob-envtest-ca", cwd=self.dir)

    def issue(self, stem: str, subject: str, *, server_names: Sequence[str] = (),
              server_ips: Sequence[str] = ()) -> tuple[Path, Path]:
        """A certificate and its key: for a server when names or IPs are given, else for a client."""
        key, csr, crt, ext = (self.dir / f"{stem}.{s}" for s in ("key", "csr", "crt", "ext"))
        openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", str(key), "-out", str(csr), "-subj", subject, cwd=self.dir)
        lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
        if server_names or server_ips:
            lines.append("extendedKeyUsage=serverAuth")
            sans = [f"DNS:{n}" for n in server_names] + [f"IP:{i}" for i in server_ips]
            lines.append("subjectAltName=" + ",".join(sans))
        else:
            lines.append("extendedKeyUsage=clientAuth")
        ext.write_text("\n".join(lines) + "\n")
        openssl("x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key),
                "-CAcreateserial", "-days", "365", "-sha256", "-extfile", str(ext), "-out", str(crt),
                cwd=self.dir)
        return crt, key


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, ca_cert: Path, user_name: str, *,
                     token: str | None = None, client_cert: Path | None = None,
                     client_key: Path | None = None, namespace: str | None = None) -> str:
    """Write a self-contained kubeconfig (data embedded) and return its path."""
    user: dict = {}
    if token is not None:
        user["token"] = token
    if client_cert is not None and client_key is not None:
        user["client-certificate-data"] = _b64(client_cert)
        user["client-key-data"] = _b64(client_key)
    context = {"cluster": "envtest", "user": user_name}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "envtest", "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)}}],
        "users": [{"name": user_name, "user": user}],
        "contexts": [{"name": "envtest", "context": context}],
        "current-context": "envtest",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2))  # JSON is valid YAML
    path.chmod(0o600)
    return str(path)
