"""The operator's settings, read once from the environment.

The Helm chart sets these variables; their names are a contract (docs/operator.md).
The default pod settings of the Ray head and workers (docs/pod-settings.md) come from
EMBEDJOB_POD_DEFAULTS (YAML or JSON) or the file EMBEDJOB_POD_DEFAULTS_FILE names.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Mapping

import yaml
from pydantic import ValidationError

from embedjob.api import DNS_LABEL, PodDefaults, SpecError
from embedjob.contract import DATABASE_URL_ENV, POOL_LEASE_EXPIRY_SECONDS
from embedjob.pod_policy import PodPolicy, PodPolicyError, repository

POD_DEFAULTS_ENV = "EMBEDJOB_POD_DEFAULTS"
POD_DEFAULTS_FILE_ENV = "EMBEDJOB_POD_DEFAULTS_FILE"
# The pod policy's parameters as JSON: the data of the chart's pod-policy ConfigMap (embedjob.pod_policy).
POD_POLICY_ENV = "EMBEDJOB_POD_POLICY"


class SettingsError(ValueError):
    """An environment variable holds a value the operator cannot use."""


def _package_version() -> str:
    try:
        return version("embedjob")
    except PackageNotFoundError:
        return "0.1.0"


# The worker image the Dockerfile in worker_image/ builds, tagged with this version.
DEFAULT_WORKER_IMAGE = f"embedjob-worker:{_package_version()}"
# Must equal the ray[default] pin of the `worker` extra (the image's Ray).
DEFAULT_RAY_VERSION = "2.60.0"


@dataclass(frozen=True)
class Settings:
    watch_namespaces: tuple[str, ...]  # empty: cluster-wide
    worker_image: str
    ray_version: str
    database_url: str | None  # read-only role for progress; None: no progress
    health_port: int
    metrics_port: int
    progress_interval_seconds: float
    log_format: str  # json | plain
    cleanup_timeout_seconds: float
    retry_delay_seconds: float
    pool_idle_seconds: float  # a pool no job leases is removed after this long (docs/pools.md)
    pool_sweep_seconds: float
    pool_lease_expiry_seconds: float  # a lease whose heartbeat is older is no longer live
    pod_defaults: PodDefaults = field(default_factory=PodDefaults)  # merged under each job's pod settings
    default_queue_name: str | None = None  # the Kueue LocalQueue of jobs that name none (docs/kueue.md)
    pod_policy: PodPolicy = field(default_factory=PodPolicy)  # what a job's pod settings may ask for

    @property
    def clusterwide(self) -> bool:
        return not self.watch_namespaces

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env

        def text(name: str, default: str) -> str:
            return env.get(name, "").strip() or default

        def number(name: str, default: float, minimum: float, kind: type = float):
            raw = text(name, str(default))
            try:
                value = kind(raw)
            except ValueError:
                raise SettingsError(f"{name}={raw!r} is not {'an integer' if kind is int else 'a number'}") from None
            if value < minimum:
                raise SettingsError(f"{name}={raw!r} must be at least {minimum}")
            return value

        log_format = text("EMBEDJOB_LOG_FORMAT", "json").lower()
        if log_format not in ("json", "plain"):
            raise SettingsError(f"EMBEDJOB_LOG_FORMAT={log_format!r} must be json or plain")
        default_queue = env.get("EMBEDJOB_DEFAULT_QUEUE_NAME", "").strip() or None
        if default_queue is not None and not (len(default_queue) <= 63 and re.fullmatch(DNS_LABEL, default_queue)):
            raise SettingsError(f"EMBEDJOB_DEFAULT_QUEUE_NAME={default_queue!r} is not a LocalQueue name "
                                "(a DNS label: lowercase letters, digits and '-', at most 63 characters)")
        namespaces = tuple(ns.strip() for ns in env.get("EMBEDJOB_WATCH_NAMESPACES", "").split(",") if ns.strip())
        worker_image = text("EMBEDJOB_WORKER_IMAGE", DEFAULT_WORKER_IMAGE)
        pod_defaults = pod_defaults_from_env(env)
        return cls(
            watch_namespaces=namespaces,
            worker_image=worker_image,
            ray_version=text("EMBEDJOB_RAY_VERSION", DEFAULT_RAY_VERSION),
            database_url=env.get(DATABASE_URL_ENV, "").strip() or None,
            health_port=number("EMBEDJOB_HEALTH_PORT", 8080, 1, int),
            metrics_port=number("EMBEDJOB_METRICS_PORT", 9090, 0, int),
            progress_interval_seconds=number("EMBEDJOB_PROGRESS_INTERVAL_SECONDS", 10.0, 0.1),
            log_format=log_format,
            cleanup_timeout_seconds=number("EMBEDJOB_CLEANUP_TIMEOUT_SECONDS", 120.0, 0),
            retry_delay_seconds=number("EMBEDJOB_RETRY_DELAY_SECONDS", 30.0, 0.1),
            pool_idle_seconds=number("EMBEDJOB_POOL_IDLE_SECONDS", 600.0, 0),
            pool_sweep_seconds=number("EMBEDJOB_POOL_SWEEP_SECONDS", 60.0, 0.1),
            # Drivers heartbeat every HEARTBEAT_S; a minute of silence is a dead driver, not a slow one.
            pool_lease_expiry_seconds=number("EMBEDJOB_POOL_LEASE_EXPIRY_SECONDS", POOL_LEASE_EXPIRY_SECONDS, 1),
            pod_defaults=pod_defaults,
            default_queue_name=default_queue,
            pod_policy=pod_policy_from_env(env, worker_image, pod_defaults),
        )


def pod_policy_from_env(env: Mapping[str, str], worker_image: str, pod_defaults: PodDefaults) -> PodPolicy:
    """EMBEDJOB_POD_POLICY; unset, the restrictive default the chart renders too: the worker image's
    repository, and no ServiceAccount but the namespace's default and the one of the operator's pod defaults."""
    text = env.get(POD_POLICY_ENV, "").strip()
    if not text:
        accounts = tuple(dict.fromkeys(
            template.spec.service_account_name for template in (pod_defaults.head, pod_defaults.workers)
            if template and template.spec and template.spec.service_account_name))
        return PodPolicy(allowed_image_prefixes=(repository(worker_image),), allowed_service_accounts=accounts)
    try:
        return PodPolicy.from_data(yaml.safe_load(text), POD_POLICY_ENV)
    except yaml.YAMLError as exc:
        raise SettingsError(f"{POD_POLICY_ENV}: not JSON: {exc}") from None
    except PodPolicyError as exc:
        raise SettingsError(str(exc)) from None


def pod_defaults_from_env(env: Mapping[str, str]) -> PodDefaults:
    """EMBEDJOB_POD_DEFAULTS, else the file EMBEDJOB_POD_DEFAULTS_FILE, else none."""
    text, source = env.get(POD_DEFAULTS_ENV, "").strip(), POD_DEFAULTS_ENV
    path = env.get(POD_DEFAULTS_FILE_ENV, "").strip()
    if text and path:
        raise SettingsError(f"set {POD_DEFAULTS_ENV} or {POD_DEFAULTS_FILE_ENV}, not both")
    return pod_defaults_file(path, f"{POD_DEFAULTS_FILE_ENV}={path}") if path else parse_pod_defaults(text, source)


def pod_defaults_file(path: str, source: str) -> PodDefaults:
    """Default pod settings from the YAML or JSON file `path`."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeError) as exc:
        raise SettingsError(f"{source}: cannot read it: {exc}") from None
    return parse_pod_defaults(text, source)


def parse_pod_defaults(text: str, source: str) -> PodDefaults:
    """Default pod settings from YAML or JSON text; SettingsError naming `source` and each bad field."""
    try:
        data = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        raise SettingsError(f"{source}: not YAML or JSON: {exc}") from None
    if data is None:
        return PodDefaults()
    if not isinstance(data, dict):
        raise SettingsError(f"{source}: expected an object with head and/or workers")
    try:
        return PodDefaults.model_validate(data)
    except ValidationError as exc:
        raise SettingsError(f"{source}: {SpecError.from_validation_error(exc, prefix='podDefaults')}") from None
