"""pytest plugin: a real Kubernetes control plane for embedjob's tests.

Loaded from ``tests/conftest.py`` with ``pytest_plugins = ["envtest.plugin"]``.

Fixtures
--------
``kube`` (session)
    etcd + kube-apiserver (built from Go modules by ``tests/envtest/setup``) on
    free loopback ports, RBAC on, TokenRequest working, KubeRay's CRDs and the
    repo's ``crds/*.yaml`` installed (server-side apply) and Established.
    ``KUBECONFIG`` points at an admin kubeconfig while the session runs.
    Returns a :class:`Kube`.
``namespace`` (function)
    A fresh namespace (unique name, with its ``default`` ServiceAccount), deleted
    afterwards (it stays Terminating: no namespace controller runs).
``kuberay_operator`` (session)
    The real KubeRay operator running against ``kube``; a :class:`KubeRayOperator`.

There is no kubelet, scheduler or kube-controller-manager: pods never run, owned
objects are not garbage-collected, namespaces are not finalized.

Binaries come from the ``EMBEDJOB_*`` variables that ``setup`` prints when they
are all set; otherwise the plugin runs ``setup`` itself (which builds what is
missing). With ``EMBEDJOB_ENVTEST_SKIP=1`` and binaries missing, the fixtures
skip instead of building.
"""

from __future__ import annotations

import atexit
import base64
import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import pytest

HERE = Path(__file__).resolve().parent
SETUP = HERE / "setup"
VERSIONS_ENV = HERE / "versions.env"
REPO_ROOT = HERE.parent.parent
REPO_CRDS = REPO_ROOT / "crds"

#: attribute name on :class:`Binaries` -> environment variable printed by setup
BINARY_ENV = {
    "etcd": "EMBEDJOB_ETCD",
    "kube_apiserver": "EMBEDJOB_KUBE_APISERVER",
    "helm": "EMBEDJOB_HELM",
    "ray_operator": "EMBEDJOB_RAY_OPERATOR",
    "kubectl": "EMBEDJOB_KUBECTL",
}
CRDS_ENV = "EMBEDJOB_KUBERAY_CRDS"
SKIP_ENV = "EMBEDJOB_ENVTEST_SKIP"

K8S_FIXTURES = {"kube", "namespace", "kuberay_operator"}


# --------------------------------------------------------------------------
# pytest hooks
# --------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "k8s: needs the envtest Kubernetes control plane (etcd + kube-apiserver, "
        "optionally the KubeRay operator); added automatically to tests that use "
        "the kube / namespace / kuberay_operator fixtures",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if K8S_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.k8s)


# --------------------------------------------------------------------------
# child processes: own process group, killed on teardown, at exit, and when
# pytest itself dies (PR_SET_PDEATHSIG)
# --------------------------------------------------------------------------

_CHILDREN: list[subprocess.Popen] = []


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _spawn(args: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [str(a) for a in args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # own process group
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
    _CHILDREN.append(proc)
    return proc


def _stop(proc: subprocess.Popen, timeout: float = 15) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    # whatever is left of the group (the leader included) goes now
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    if proc in _CHILDREN:
        _CHILDREN.remove(proc)


@atexit.register
def _stop_all_children() -> None:
    for proc in list(reversed(_CHILDREN)):
        _stop(proc, timeout=5)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(what: str, check, timeout: float, proc: subprocess.Popen | None = None,
              log: Path | None = None, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode}; log {log}:\n{_tail(log) if log else ''}")
        try:
            if check():
                return
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"{what}: not ready after {timeout}s (last error: {last!r}); log {log}:\n{_tail(log) if log else ''}")


def read_versions() -> dict[str, str]:
    """The pins of versions.env (KUBERNETES_VERSION, ETCD_VERSION, HELM_VERSION, KUBERAY_VERSION, ...)."""
    versions = {}
    for line in VERSIONS_ENV.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            versions[key.strip()] = value.strip()
    return versions


# --------------------------------------------------------------------------
# binaries
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Binaries:
    """Paths of the harness binaries; attribute or item access (``bin.helm``, ``bin["helm"]``)."""

    etcd: str
    kube_apiserver: str
    helm: str
    ray_operator: str
    kubectl: str
    kuberay_crds: str

    def __getitem__(self, name: str) -> str:
        return getattr(self, name.replace("-", "_"))

    def as_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


def _binaries_from_env(env) -> Binaries | None:
    values = {attr: env.get(var, "") for attr, var in BINARY_ENV.items()}
    values["kuberay_crds"] = env.get(CRDS_ENV, "")
    if all(values.values()) and all(os.access(values[a], os.X_OK) for a in BINARY_ENV) \
            and Path(values["kuberay_crds"]).is_dir():
        return Binaries(**values)
    return None


def find_binaries() -> Binaries:
    """The harness binaries: from the environment, else built by ``setup``."""
    found = _binaries_from_env(os.environ)
    if found:
        return found
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"envtest binaries missing and {SKIP_ENV}=1; build them with: eval \"$({SETUP.relative_to(REPO_ROOT)})\"")
    started = time.monotonic()
    res = subprocess.run([str(SETUP)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{SETUP} failed ({res.returncode}):\n{res.stderr[-4000:]}")
    exported = {}
    for line in res.stdout.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, value = words[1].split("=", 1)
            exported[key] = value
    os.environ.update(exported)  # helpers run by tests (helm, ...) see them too
    found = _binaries_from_env(exported)
    if not found:
        raise RuntimeError(f"{SETUP} did not print usable paths:\n{res.stdout}\n{res.stderr[-2000:]}")
    sys.stderr.write(f"envtest: setup took {time.monotonic() - started:.1f}s\n")
    return found


# --------------------------------------------------------------------------
# certificates and kubeconfigs
# --------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    res = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{res.stderr}")


def _subject(common_name: str, organizations: Iterable[str] = ()) -> str:
    def esc(v: str) -> str:
        return re.sub(r"([/=+,\\])", r"\\\1", v)

    return "".join(f"/O={esc(o)}" for o in organizations) + f"/CN={esc(common_name)}"


class _CA:
    """A throwaway certificate authority (openssl CLI, P-256 keys)."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cert = self.dir / "ca.crt"
        self.key = self.dir / "ca.key"
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(self.key), "-out", str(self.cert), "-days", "3650",
                 "-subj", "/CN=embedjob-envtest-ca", cwd=self.dir)

    def issue(self, stem: str, subject: str, *, server_names: Sequence[str] = (),
              server_ips: Sequence[str] = ()) -> tuple[Path, Path]:
        key, csr, crt, ext = (self.dir / f"{stem}.{s}" for s in ("key", "csr", "crt", "ext"))
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(key), "-out", str(csr), "-subj", subject, cwd=self.dir)
        lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
        if server_names or server_ips:
            lines.append("extendedKeyUsage=serverAuth")
            sans = [f"DNS:{n}" for n in server_names] + [f"IP:{i}" for i in server_ips]
            lines.append("subjectAltName=" + ",".join(sans))
        else:
            lines.append("extendedKeyUsage=clientAuth")
        ext.write_text("\n".join(lines) + "\n")
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key),
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


def _safe(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "_", name)[:60]


# --------------------------------------------------------------------------
# the control plane
# --------------------------------------------------------------------------


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{shlex.join(self.cmd)} exited {self.returncode}:\n{self.stderr or ''}{self.stdout or ''}"


@dataclass
class Kube:
    """A running envtest control plane (see the module docstring)."""

    server: str  #: https://127.0.0.1:PORT
    kubeconfig: str  #: admin kubeconfig path (client cert, group system:masters)
    bin: Binaries  #: binary paths (.etcd, .kube_apiserver, .helm, .ray_operator, .kubectl, .kuberay_crds)
    workdir: Path  #: temp dir with certs, etcd data, logs, kubeconfigs
    ca_cert: Path  #: CA that signed the serving and client certs
    apiserver_log: Path
    etcd_log: Path
    etcd_url: str
    versions: dict  #: the pins of tests/envtest/versions.env
    _ca: _CA = field(repr=False)
    _user_kubeconfigs: dict = field(default_factory=dict, repr=False)

    @property
    def kuberay_crds(self) -> Path:
        return Path(self.bin.kuberay_crds)

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
            crt, pkey = self._ca.issue(stem, _subject(name, groups))
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
        if names:
            self.kubectl("wait", "--for=condition=Established", f"--timeout={int(timeout)}s", *names)


def _ssl_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
            return resp.status == 200
    except urllib.error.HTTPError:
        return False


def start_control_plane(workdir: Path, binaries: Binaries) -> tuple[Kube, list[subprocess.Popen]]:
    """Start etcd + kube-apiserver in ``workdir``; return the Kube and the processes (etcd first)."""
    procs: list[subprocess.Popen] = []
    try:
        # --- etcd
        etcd_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd_log = workdir / "etcd.log"
        etcd = _spawn([
            binaries.etcd, "--name=envtest", f"--data-dir={workdir / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=envtest={peer_url}", "--unsafe-no-fsync", "--log-level=warn",
        ], etcd_log)
        procs.append(etcd)

        # --- certificates: serving, admin client, service-account signing key
        pki = workdir / "pki"
        ca = _CA(pki)
        serving_crt, serving_key = ca.issue(
            "apiserver", "/CN=kube-apiserver",
            server_names=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            server_ips=["127.0.0.1", "10.0.0.1"])
        admin_crt, admin_key = ca.issue("admin", _subject("embedjob-envtest-admin", ["system:masters"]))
        sa_key = pki / "sa.key"
        _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(sa_key), cwd=pki)

        _wait_for("etcd", lambda: _http_ok(f"{etcd_url}/health"), 60, etcd, etcd_log)

        # --- kube-apiserver
        port = free_port()
        server = f"https://127.0.0.1:{port}"
        apiserver_log = workdir / "kube-apiserver.log"
        apiserver = _spawn([
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
        ], apiserver_log)
        procs.append(apiserver)

        ctx = _ssl_context(ca.cert, admin_crt, admin_key)
        _wait_for("kube-apiserver /readyz", lambda: _http_ok(f"{server}/readyz", ctx), 180, apiserver, apiserver_log)

        kubeconfig = write_kubeconfig(workdir / "admin.kubeconfig", server, ca.cert, "envtest-admin",
                                      client_cert=admin_crt, client_key=admin_key)
        kube = Kube(server=server, kubeconfig=kubeconfig, bin=binaries, workdir=workdir, ca_cert=ca.cert,
                    apiserver_log=apiserver_log, etcd_log=etcd_log, etcd_url=etcd_url,
                    versions=read_versions(), _ca=ca)
        return kube, procs
    except BaseException:
        for p in reversed(procs):
            _stop(p)
        raise


def _ensure_default_serviceaccount(kube: Kube, namespace: str) -> None:
    """Do what kube-controller-manager's ServiceAccount controller would: create ``default``."""
    manifest = json.dumps({"apiVersion": "v1", "kind": "ServiceAccount",
                           "metadata": {"name": "default", "namespace": namespace}})
    kube.apply(manifest)


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def envtest_binaries() -> Binaries:
    """Paths of the harness binaries (built by ``tests/envtest/setup`` if missing)."""
    return find_binaries()


@pytest.fixture(scope="session")
def kube(envtest_binaries: Binaries, request: pytest.FixtureRequest) -> Iterator[Kube]:
    workdir = Path(tempfile.mkdtemp(prefix="embedjob-envtest-"))
    kube, procs = start_control_plane(workdir, envtest_binaries)
    old_kubeconfig = os.environ.get("KUBECONFIG")
    try:
        # the "default" namespace is created by the API server's bootstrap controller
        _wait_for("namespace default",
                  lambda: kube.kubectl("get", "namespace", "default", check=False).returncode == 0,
                  60, procs[-1], kube.apiserver_log)
        _ensure_default_serviceaccount(kube, "default")
        crds = sorted(kube.kuberay_crds.glob("*.yaml"))
        # EMBEDJOB_ENVTEST_REPO_CRDS=0 leaves the repo's crds/ out (to debug the harness alone)
        if REPO_CRDS.is_dir() and os.environ.get("EMBEDJOB_ENVTEST_REPO_CRDS", "1") != "0":
            crds += sorted(p for p in REPO_CRDS.glob("*.yaml") if p.name != "kustomization.yaml")
        kube.install_crds(crds)
        os.environ["KUBECONFIG"] = kube.kubeconfig
        yield kube
    finally:
        if old_kubeconfig is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old_kubeconfig
        for p in reversed(procs):
            _stop(p)
        # logs are kept for debugging when a test failed (or EMBEDJOB_ENVTEST_KEEP=1)
        if os.environ.get("EMBEDJOB_ENVTEST_KEEP") == "1" or request.session.testsfailed:
            sys.stderr.write(f"envtest: kept {workdir} (logs, certs, kubeconfigs)\n")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _namespace_name(request: pytest.FixtureRequest) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")
    base = re.sub(r"^test-?", "", base)[:40].strip("-") or "t"
    return f"{base}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (name returned) with its ``default`` ServiceAccount."""
    name = _namespace_name(request)
    kube.kubectl("create", "namespace", name)
    _ensure_default_serviceaccount(kube, name)
    try:
        yield name
    finally:
        kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@dataclass
class KubeRayOperator:
    """The running KubeRay operator."""

    process: subprocess.Popen
    log_path: Path  #: its stdout/stderr
    kubeconfig: str  #: the operator's own identity (client cert, user kuberay-operator)
    metrics_url: str
    health_url: str
    version: str

    def log_tail(self, lines: int = 60) -> str:
        return _tail(self.log_path, lines)


@pytest.fixture(scope="session")
def kuberay_operator(kube: Kube) -> Iterator[KubeRayOperator]:
    workdir = kube.workdir / "kuberay-operator"
    workdir.mkdir(exist_ok=True)
    kubeconfig = kube.kubeconfig_for_user("kuberay-operator", ["system:masters"])
    metrics_port, probe_port = free_port(), free_port()
    log_path = workdir / "operator.log"
    env = {**os.environ, "KUBECONFIG": kubeconfig, "ENABLE_WEBHOOKS": "false"}
    proc = _spawn([
        kube.bin.ray_operator,
        f"--metrics-addr=127.0.0.1:{metrics_port}",
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
        "--enable-leader-election=false",
        "--log-stdout-encoder=console",
    ], log_path, env=env)
    operator = KubeRayOperator(
        process=proc, log_path=log_path, kubeconfig=kubeconfig,
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        health_url=f"http://127.0.0.1:{probe_port}/readyz",
        version=kube.versions["KUBERAY_VERSION"],
    )
    try:
        _wait_for("kuberay operator /readyz", lambda: _http_ok(operator.health_url), 120, proc, log_path)
        sys.stderr.write(f"envtest: kuberay operator log: {log_path}\n")
        yield operator
    finally:
        _stop(proc)
