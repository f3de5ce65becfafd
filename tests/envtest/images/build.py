"""Builds the test images with buildah: a Debian base from debootstrap, then the controller and worker images from
the repository's own Dockerfiles on it, each cached (in buildah's storage) under a tag that hashes its inputs.

    python -m envtest.images.build [controller|worker ...]     (from tests/, as root; prints build times)

A test that needs the model in the worker image gets a small derived image (model_image: model.Containerfile
FROM the worker image, a seconds-long build) rather than a rebuild of the worker image with MODEL_PACKAGE.

No registry and no daemon: the base images the Dockerfiles name by default cannot be pulled here, so the
Dockerfiles get `--build-arg BASE_IMAGE=` stand-ins (bases.Containerfile) that provide what the upstream
bases do. PyPI is reached as the host reaches it: the host's CA bundle and pip config are lent to the build
read-only (never baked into an image).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from support.dockerfiles import (CONTROLLER_DOCKERFILE, MODEL_CONTAINERFILE, WORKER_DOCKERFILE, copy_sources,
                                 parse_dockerfile)
from support.paths import REPO

CACHE = Path(os.environ.get("EMBEDJOB_CACHE", Path.home() / ".cache" / "embedjob")) / "images"
#: buildah's image store for the test images only (the cache: images stay between runs)
STORAGE = CACHE / "storage"
RUNROOT = Path("/run/embedjob-test-buildah")
HERE = Path(__file__).resolve().parent
BASES_CONTAINERFILE = HERE / "bases.Containerfile"

DEBIAN_SUITE = "bookworm"  # Python 3.11, as the upstream bases
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates")
#: where the build finds the lent CA bundle and pip config (Debian's paths; pip.conf names the bundle)
CA_BUNDLE_IN_BUILD = "/etc/ssl/certs/ca-certificates.crt"
PIP_CONF_IN_BUILD = "/etc/pip.conf"
#: files the Dockerfiles' COPY of a directory leaves out (.dockerignore)
IGNORED = re.compile(r"(^|/)(__pycache__|[^/]*\.pyc|[^/]*\.egg-info)(/|$)")


class ImageBuildError(RuntimeError):
    """A test image could not be built; the message names the step and ends with its output."""


@dataclass(frozen=True)
class Image:
    name: str  #: controller, worker or worker-model
    reference: str  #: localhost/embedjob-test/NAME:INPUTS-HASH in STORAGE
    built_seconds: float | None  #: None: it came from the cache


BUILDAH = ["buildah", "--root", str(STORAGE), "--runroot", str(RUNROOT), "--storage-driver", "overlay"]


def buildah(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    argv = [*BUILDAH, *args]
    # its own process group: a build's RUN steps outlive a killed buildah otherwise
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:  # a timeout, or the test run interrupted
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    result = subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)
    if result.returncode != 0:
        raise ImageBuildError(f"buildah {' '.join(args[:2])} failed (exit {result.returncode}):\n"
                              f"{(result.stdout + result.stderr)[-4000:]}")
    return result


def image_exists(reference: str) -> bool:
    argv = [*BUILDAH, "inspect", "--type", "image", reference]
    return subprocess.run(argv, capture_output=True, timeout=120).returncode == 0


def image_size_bytes(reference: str) -> int:
    """The unpacked size of the image: the sum of its layers' (uncompressed) sizes in its manifest."""
    manifest = json.loads(json.loads(buildah("inspect", "--type", "image", reference).stdout)["Manifest"])
    return sum(layer["size"] for layer in manifest["layers"])


def digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def debian_mirror() -> str:
    """The Debian mirror apt on this machine uses for the suite (deb822 .sources or a one-line sources.list)."""
    apt = Path("/etc/apt")
    candidates = []
    for sources in sorted((apt / "sources.list.d").glob("*.sources")):
        for stanza in sources.read_text().split("\n\n"):
            fields = dict(re.findall(r"^([\w-]+):\s*(.+)$", stanza, re.M))
            if "deb" in fields.get("Types", "").split() and DEBIAN_SUITE in fields.get("Suites", "").split():
                candidates += fields.get("URIs", "").split()
    for listing in [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*.list"))]:
        if listing.is_file():
            for words in (line.split() for line in listing.read_text().splitlines()):
                if len(words) >= 3 and words[0] == "deb":
                    uri, suite = [w for w in words[1:] if not w.startswith("[")][:2]
                    candidates += [uri] if suite == DEBIAN_SUITE else []
    if not candidates:
        raise ImageBuildError(f"apt has no `deb` source for {DEBIAN_SUITE} under {apt}: no mirror for debootstrap")
    return candidates[0]


def host_pip_files() -> list[str]:
    """`buildah bud --volume` options that lend the host's CA bundle and global pip config, read-only."""
    bundle = os.environ.get("PIP_CERT") or ssl.get_default_verify_paths().cafile or CA_BUNDLE_IN_BUILD
    volumes = [f"{bundle}:{CA_BUNDLE_IN_BUILD}:ro"]
    for conf in (Path("/etc/pip.conf"), Path("/etc/xdg/pip/pip.conf")):
        if conf.is_file():
            volumes.append(f"{conf}:{PIP_CONF_IN_BUILD}:ro")
            break
    return [arg for volume in volumes for arg in ("--volume", volume)]


@contextlib.contextmanager
def build_lock(name: str):
    """One builder of an image at a time per cache (two test runs share the images)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".lock-{name}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def log(message: str) -> None:
    print(f"envtest/images: {message}", file=sys.stderr, flush=True)


def debian_base() -> tuple[str, float | None]:
    """The debootstrap root filesystem as an image (cached by suite, packages and mirror)."""
    mirror = debian_mirror()
    reference = f"localhost/embedjob-test/debian:{digest(DEBIAN_SUITE, *DEBIAN_PACKAGES, mirror)}"
    if image_exists(reference):
        return reference, None
    start = time.monotonic()
    log(f"debootstrap {DEBIAN_SUITE} from {mirror} ...")
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="rootfs-") as rootfs:
        result = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", DEBIAN_SUITE,
             rootfs, mirror], capture_output=True, text=True, timeout=1800)
        if result.returncode != 0:
            raise ImageBuildError(f"debootstrap failed (exit {result.returncode}):\n{result.stdout[-3000:]}"
                                  f"{result.stderr[-2000:]}")
        # apt's downloaded packages are no part of an image
        shutil.rmtree(Path(rootfs, "var/cache/apt/archives"), ignore_errors=True)
        container = buildah("from", "scratch").stdout.strip()
        try:
            buildah("copy", container, rootfs, "/")
            buildah("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "--cmd", "/bin/bash", container)
            buildah("commit", "--quiet", container, reference)
        finally:
            buildah("rm", container)
    return reference, time.monotonic() - start


def context_files(dockerfile: Path) -> list[Path]:
    """The build-context files the Dockerfile's COPY instructions read, sorted."""
    files = []
    for source in copy_sources(parse_dockerfile(dockerfile)):
        path = REPO / source
        found = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        files += [p for p in found if not IGNORED.search(p.relative_to(REPO).as_posix())]
    return sorted(files)


def bud(reference: str, containerfile: Path, build_args: dict[str, str], *options: str) -> float:
    start = time.monotonic()
    args = [f"--build-arg={name}={value}" for name, value in build_args.items()]
    buildah("bud", "--isolation", "chroot", "--layers=false", "--pull=never", "--quiet", "--file",
            str(containerfile), *args, *options, *host_pip_files(), "--tag", reference, str(REPO))
    return time.monotonic() - start


def stand_in_base(name: str, debian: str) -> tuple[str, float | None]:
    """The stand-in for the Dockerfile's upstream base: a stage of bases.Containerfile on the Debian image."""
    reference = f"localhost/embedjob-test/{name}-base:{digest(debian, BASES_CONTAINERFILE.read_text())}"
    if image_exists(reference):
        return reference, None
    return reference, bud(reference, BASES_CONTAINERFILE, {"DEBIAN_BASE": debian}, "--target", f"{name}-base")


DOCKERFILES = {"controller": CONTROLLER_DOCKERFILE, "worker": WORKER_DOCKERFILE}


def image_inputs(name: str, base: str, build_args: dict[str, str]) -> str:
    """The hash of everything the image's content depends on: Dockerfile, base, build args, copied files."""
    dockerfile = DOCKERFILES[name]
    files = context_files(dockerfile)
    return digest(dockerfile.read_text(), base, json.dumps(build_args, sort_keys=True),
                  *(f"{p.relative_to(REPO)}" for p in files), *(p.read_bytes() for p in files))


def build_image(name: str, build_args: dict[str, str] | None = None, *, build: bool = True) -> Image | None:
    """The controller or worker image from its Dockerfile on the stand-in base, built unless cached
    (with ``build=False``: None unless cached)."""
    with build_lock("debian"):
        debian, debian_seconds = debian_base()
    if debian_seconds is not None:
        log(f"debian base built in {debian_seconds:.0f}s")
    with build_lock(name):
        base, base_seconds = stand_in_base(name, debian)
        if base_seconds is not None:
            log(f"{name} base built in {base_seconds:.0f}s")
        args = {"BASE_IMAGE": base, **(build_args or {})}
        reference = f"localhost/embedjob-test/{name}:{image_inputs(name, base, args)}"
        if image_exists(reference):
            return Image(name, reference, None)
        if not build:
            return None
        log(f"building {reference} from {DOCKERFILES[name].relative_to(REPO)} ...")
        seconds = bud(reference, DOCKERFILES[name], args)
        log(f"{name} image built in {seconds:.0f}s")
        return Image(name, reference, seconds)


def model_image(worker: Image, package: str) -> Image:
    """The worker image with ``package`` (a model distribution, NAME==VERSION) baked in as the worker Dockerfile's
    MODEL_PACKAGE bakes it, built from model.Containerfile on ``worker`` unless cached."""
    args = {"WORKER_IMAGE": worker.reference, "MODEL_PACKAGE": package}
    reference = (f"localhost/embedjob-test/worker-model:"
                 f"{digest(MODEL_CONTAINERFILE.read_text(), json.dumps(args, sort_keys=True))}")
    with build_lock("worker-model"):
        if image_exists(reference):
            return Image("worker-model", reference, None)
        log(f"building {reference} ({package} on {worker.reference}) ...")
        seconds = bud(reference, MODEL_CONTAINERFILE, args)
        log(f"worker-model image built in {seconds:.0f}s")
        return Image("worker-model", reference, seconds)


def main(names: list[str]) -> None:
    for name in names or list(DOCKERFILES):
        start = time.monotonic()
        image = build_image(name)
        size = image_size_bytes(image.reference) / 1e6
        print(f"{name}: {image.reference} {size:.0f} MB, {'cached' if image.built_seconds is None else 'built'}"
              f" in {time.monotonic() - start:.1f}s")


if __name__ == "__main__":
    main(sys.argv[1:])
