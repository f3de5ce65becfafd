"""The control plane: etcd + kube-apiserver as child processes, and `Kube`, the handle tests use.

There is no kubelet, scheduler or kube-controller-manager: pods never run, owned objects
are not garbage-collected, namespaces are not finalized (envtest.realnode adds them).
`Kube.restart_apiserver()` stops kube-apiserver and starts it again on the same port and
etcd, for tests of clients that must survive it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import ssl
import subprocess
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from envtest.api_reads import ApiReads
from envtest.binaries import Binaries, read_versions
from envtest.pki import CA, openssl, subject_of, write_kubeconfig
from support.net import free_port
from support.paths import REPO_CRDS
from support.processes import http_ok, spawn, stop, wait_for


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{shlex.join(self.cmd)} exited {self.returncode}:\n{self.stderr or ''}{self.stdout or ''}"


def _safe(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "_", name)[:60]


@dataclass
class Kube:
    """A running envtest control plane."""

    server: str  #: https://127.0.0.1:PORT
    kubeconfig: str  #: admin kubeconfig path (client cert, group system:masters)
    bin: Binaries  #: binary paths (.etcd, .kube_apiserver, .helm, .ray_operator, .kubectl, .kuberay_crds)
    workdir: Path  #: temp dir with certs, etcd data, logs, kubeconfigs
    ca_cert: Path  #: CA that signed the serving and client certs
    apiserver_log: Path
    etcd_log: Path
    etcd_url: str
    versions: dict  #: the pins of tests/envtest/versions.env
    _ca: CA = field(repr=False)
    _procs: list = field(repr=False)  #: the running [etcd, kube-apiserver], stopped by running_control_plane
    _apiserver_args: list = field(repr=False)
    _admin_tls: ssl.SSLContext = field(repr=False)
    _user_kubeconfigs: dict = field(default_factory=dict, repr=False)
    _reads: ApiReads | None = field(default=None, init=False, repr=False)

    @property
    def kuberay_crds(self) -> Path:
        return Path(self.bin.kuberay_crds)

    @property
    def reads(self) -> ApiReads:
        """Plain reads as admin from this process (envtest.api_reads), for what the tests poll."""
        if self._reads is None:
            self._reads = ApiReads(self.server, self._admin_tls)
        return self._reads

    def kubectl(self, *args, check: bool = True, input: str | None = None,
                kubeconfig: str | os.PathLike | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run kubectl against this API server (admin unless ``kubeconfig`` is given).

        Returns the CompletedProcess (text stdout/stderr); raises
        :class:`KubectlError` (a CalledProcessError that prints stderr) on a
        non-zero exit when ``check``.
        """
        cmd = [self.bin.kubectl, f"--kubeconfig={kubeconfig or self.kubeconfig}", *map(str, args)]
        res = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise KubectlError(res.returncode, cmd, res.stdout, res.stderr)
        return res

    def kubeconfig_for_serviceaccount(self, namespace: str, name: str, *, duration: str = "2h") -> str:
        """A kubeconfig that authenticates as ServiceAccount ``namespace/name``.

        The token comes from the TokenRequest API (``kubectl create token``); the
        ServiceAccount must exist.
        """
        token = self.kubectl("create", "token", name, "-n", namespace, f"--duration={duration}").stdout.strip()
        path = self.workdir / "kubeconfigs" / f"sa-{_safe(namespace)}-{_safe(name)}-{uuid.uuid4().hex[:6]}.kubeconfig"
        return write_kubeconfig(path, self.server, self.ca_cert, f"system:serviceaccount:{namespace}:{name}",
                                token=token, namespace=namespace)

    def kubeconfig_for_user(self, name: str, groups: Sequence[str] = ()) -> str:
        """A kubeconfig that authenticates as user ``name`` in ``groups`` (client certificate)."""
        groups = tuple(groups)
        key = (name, groups)
        if key not in self._user_kubeconfigs:
            stem = f"user-{uuid.uuid4().hex[:8]}"
            crt, pkey = self._ca.issue(stem, subject_of(name, groups))
            path = self.workdir / "kubeconfigs" / f"{stem}-{_safe(name)}.kubeconfig"
            self._user_kubeconfigs[key] = write_kubeconfig(path, self.server, self.ca_cert, name,
                                                           client_cert=crt, client_key=pkey)
        return self._user_kubeconfigs[key]

    def apply(self, manifest: str, *, namespace: str | None = None, server_side: bool = True,
              kubeconfig: str | None = None) -> subprocess.CompletedProcess:
        """``kubectl apply -f -`` of a YAML/JSON text (server-side by default)."""
        args = ["apply", "-f", "-"]
        if server_side:
            args += ["--server-side", "--field-manager=envtest"]
        if namespace:
            args += ["-n", namespace]
        return self.kubectl(*args, input=manifest, kubeconfig=kubeconfig)

    def install_crds(self, paths: Iterable[Path], timeout: float = 60) -> None:
        """Server-side apply CRD files and wait until they are Established."""
        paths = [Path(p) for p in paths]
        if not paths:
            return
        args = ["apply", "--server-side", "--force-conflicts", "--field-manager=envtest"]
        for p in paths:
            args += ["-f", str(p)]
        names = self.kubectl(*args, "-o", "name").stdout.split()
        if not names:
            return
        wait = ("wait", "--for=condition=Established", f"--timeout={int(timeout)}s", *names)
        deadline = time.monotonic() + timeout
        # kubectl's wait fails at once, instead of waiting, on a CRD the API server has not given conditions yet
        # (".status.conditions accessor error: <nil>"), seen under load right after a CRD was created again
        while "accessor error" in self.kubectl(*wait, check=False).stderr and time.monotonic() < deadline:
            time.sleep(0.5)
        self.kubectl(*wait)

    def restart_apiserver(self, down_seconds: float = 0.0, timeout: float = 180) -> float:
        """Stop kube-apiserver (SIGTERM, as a control-plane restart does), wait ``down_seconds``,
        start it again with the same flags, port and etcd (the data stays), and wait for /readyz.
        Clients see their connections and watches drop. Returns the seconds it was unreachable."""
        old = self._procs[-1]
        stopped = time.monotonic()
        stop(old)
        time.sleep(down_seconds)
        new = spawn(self._apiserver_args, self.apiserver_log)
        self._procs[-1] = new
        wait_for("kube-apiserver /readyz after a restart", lambda: http_ok(f"{self.server}/readyz", self._admin_tls),
                 timeout, new, self.apiserver_log)
        return time.monotonic() - stopped

    def ensure_default_serviceaccount(self, namespace: str) -> None:
        """Do what kube-controller-manager's ServiceAccount controller would: create ``default``."""
        self.apply(json.dumps({"apiVersion": "v1", "kind": "ServiceAccount",
                               "metadata": {"name": "default", "namespace": namespace}}))


def _ssl_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def _start(workdir: Path, binaries: Binaries, procs: list[subprocess.Popen]) -> Kube:
    """Start etcd + kube-apiserver in ``workdir`` (appended to ``procs``, etcd first) until /readyz."""
    # --- etcd
    etcd_port, peer_port = free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    etcd_log = workdir / "etcd.log"
    etcd = spawn([
        binaries.etcd, "--name=envtest", f"--data-dir={workdir / 'etcd'}",
        f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=envtest={peer_url}", "--unsafe-no-fsync", "--log-level=warn",
    ], etcd_log)
    procs.append(etcd)

    # --- certificates: serving, admin client, service-account signing key
    pki = workdir / "pki"
    ca = CA(pki)
    serving_crt, serving_key = ca.issue(
        "apiserver", "/CN=kube-apiserver",
        server_names=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
        server_ips=["127.0.0.1", "10.0.0.1"])
    admin_crt, admin_key = ca.issue("admin", subject_of("embedjob-envtest-admin", ["system:masters"]))
    sa_key = pki / "sa.key"
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(sa_key), cwd=pki)

    wait_for("etcd", lambda: http_ok(f"{etcd_url}/health"), 60, etcd, etcd_log)

    # --- kube-apiserver
    port = free_port()
    server = f"https://127.0.0.1:{port}"
    apiserver_log = workdir / "kube-apiserver.log"
    apiserver_args = [
        binaries.kube_apiserver,
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
        f"--cert-dir={pki}", f"--tls-cert-file={serving_crt}", f"--tls-private-key-file={serving_key}",
        f"--client-ca-file={ca.cert}",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={sa_key}", f"--service-account-signing-key-file={sa_key}",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--allow-privileged=true",
        "--profiling=false",
        "--endpoint-reconciler-type=none",  # a loopback advertise address is refused otherwise
        "--v=0",
    ]
    apiserver = spawn(apiserver_args, apiserver_log)
    procs.append(apiserver)

    ctx = _ssl_context(ca.cert, admin_crt, admin_key)
    wait_for("kube-apiserver /readyz", lambda: http_ok(f"{server}/readyz", ctx), 180, apiserver, apiserver_log)

    kubeconfig = write_kubeconfig(workdir / "admin.kubeconfig", server, ca.cert, "envtest-admin",
                                  client_cert=admin_crt, client_key=admin_key)
    return Kube(server=server, kubeconfig=kubeconfig, bin=binaries, workdir=workdir, ca_cert=ca.cert,
                apiserver_log=apiserver_log, etcd_log=etcd_log, etcd_url=etcd_url,
                versions=read_versions(), _ca=ca, _procs=procs, _apiserver_args=apiserver_args, _admin_tls=ctx)


@contextmanager
def running_control_plane(workdir: Path, binaries: Binaries) -> Iterator[Kube]:
    """etcd + kube-apiserver in ``workdir``, ready for tests: the ``default`` namespace with its
    ServiceAccount, KubeRay's CRDs and the repo's ``crds/*.yaml`` (unless
    ``EMBEDJOB_ENVTEST_REPO_CRDS=0``) applied and Established; both stopped on exit."""
    procs: list[subprocess.Popen] = []
    try:
        kube = _start(workdir, binaries, procs)
        # the "default" namespace is created by the API server's bootstrap controller
        wait_for("namespace default",
                 lambda: kube.kubectl("get", "namespace", "default", check=False).returncode == 0,
                 60, procs[-1], kube.apiserver_log)
        kube.ensure_default_serviceaccount("default")
        crds = sorted(kube.kuberay_crds.glob("*.yaml"))
        # EMBEDJOB_ENVTEST_REPO_CRDS=0 leaves the repo's crds/ out (to debug the harness alone)
        if REPO_CRDS.is_dir() and os.environ.get("EMBEDJOB_ENVTEST_REPO_CRDS", "1") != "0":
            crds += sorted(p for p in REPO_CRDS.glob("*.yaml") if p.name != "kustomization.yaml")
        kube.install_crds(crds)
        yield kube
    finally:
        for p in reversed(procs):
            stop(p)
