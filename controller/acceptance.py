"""The review before a job may start: its spec parsed once, and what the CRD schema cannot check (pure functions).

A rejection is not a failure: the job stays `Accepted=False` with the reason, and the
operator looks again later (a Secret created afterwards lets the job proceed; the
spec can still be fixed because it becomes immutable only once accepted).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from embedjob import api
from embedjob.contract import DATABASE_URL_ENV, SOURCE_DATABASE_URL_ENV
from embedjob.pod_policy import PodPolicy, violations

# Schemes the driver reads through fsspec; a plain path is a file in the worker image
# or on a volume mounted into it.
SUPPORTED_SCHEMES = frozenset({"file", "s3", "gs", "gcs", "az", "abfs", "abfss", "http", "https"})
# The sample input the worker image ships (worker_image/Dockerfile copies it there).
SAMPLE_IN_WORKER_IMAGE = "/opt/embedjob/examples/pep-sample.jsonl"
# A pinned hub revision is a commit id; a branch or tag name can move under the job.
COMMIT_ID = re.compile(r"^[0-9a-f]{7,64}$")


@dataclass(frozen=True)
class Verdict:
    """The outcome of a review: accepted, or not with a CamelCase reason and a message."""

    accepted: bool
    reason: str
    message: str


ACCEPTED = Verdict(True, "RayJobCreated", "the RayJob was created")
# A scheduled job's: it has no RayJob of its own (controller.scheduler starts its runs).
SCHEDULE_ACCEPTED = Verdict(True, "ScheduleAccepted", "each tick of spec.schedule starts a run, a child EmbeddingJob")
# Written (Accepted=True pins the spec) just before the create, whose outcome is the next verdict.
REVIEWED = Verdict(True, "ReviewPassed", "the review passed; the RayJob is being created")


def _reject(reason: str, message: str) -> Verdict:
    return Verdict(False, reason, message)


def check_source(uri: str) -> Verdict | None:
    """A URL of a supported scheme or an absolute path. A relative path is refused: the driver
    runs in a pod, where nothing says what it is relative to (`embedjob run` resolves it
    against the manifest's directory, which a cluster job does not have)."""
    scheme = urlsplit(uri).scheme.lower()
    if scheme and scheme not in SUPPORTED_SCHEMES:
        supported = ", ".join(sorted(SUPPORTED_SCHEMES))
        return _reject("UnsupportedSource",
                       f"spec.source.uri: scheme {scheme!r} is not supported ({supported}, or an absolute path)")
    path = uri.split(":", 1)[1].removeprefix("//") if scheme == "file" else uri
    if scheme in ("", "file") and not path.startswith("/"):
        return _reject(
            "RelativeSourcePath",
            f"spec.source.uri: {uri!r} is a relative path, which the driver's pod cannot resolve; give an "
            "absolute path in the worker image or on a volume mounted into the Ray pods (e.g. "
            f"{SAMPLE_IN_WORKER_IMAGE}, the sample the worker image ships), or a URL (s3://, gs://, https://...)",
        )
    return None


def check_model(model: api.Model) -> Verdict | None:
    if model.revision and not (model.path or model.package) and not COMMIT_ID.match(model.revision):
        return _reject(
            "ModelNotPinned",
            f"spec.model.revision {model.revision!r} is not a commit id (7-64 lowercase hex digits); "
            "a branch or tag can change while the job runs",
        )
    return None


def check_secret(sink: api.Sink, secret: dict[str, Any] | None) -> Verdict | None:
    ref = sink.database_secret_ref
    if secret is None:
        return _reject("SecretNotFound", f"Secret {ref.name!r} (spec.sink.databaseSecretRef.name) does not exist")
    if not (secret.get("data") or {}).get(ref.key):
        return _reject(
            "SecretKeyMissing", f"Secret {ref.name!r} has no non-empty key {ref.key!r} (spec.sink.databaseSecretRef.key)"
        )
    return None


# KubeRay runs Ray in the first container of each group's pod template.
RAY_CONTAINER_INDEX = 0
# Ray's job manager runs a submitted driver on the head node unless the head sets this to 1.
DRIVER_ON_WORKERS_ENV = "RAY_JOB_ALLOW_DRIVER_ON_WORKER_NODES"


def selected_cluster(spec: api.EmbeddingJobSpec) -> str | None:
    """The name of the RayCluster a job on an existing cluster runs on (in its namespace)."""
    return (spec.cluster_selector or {}).get(api.RAY_CLUSTER_SELECTOR_KEY)


def _containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    return ((group.get("template") or {}).get("spec") or {}).get("containers") or []


def _ray_container(group: dict[str, Any]) -> dict[str, Any]:
    containers = _containers(group)
    return containers[RAY_CONTAINER_INDEX] if len(containers) > RAY_CONTAINER_INDEX else {}


def _env_var(container: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The container's `env` entry for `name` (of several, the last one wins, as in the kubelet)."""
    return next((var for var in reversed(container.get("env") or []) if var.get("name") == name), None)


def _driver_may_run_on_workers(head: dict[str, Any]) -> bool:
    """Whether the head may let Ray place the driver on a worker (Ray: the switch is "1"); what
    cannot be read here (a value from a ConfigMap, Secret or envFrom) counts as yes."""
    switch = _env_var(head, DRIVER_ON_WORKERS_ENV)
    if switch is None:
        return bool(head.get("envFrom"))
    return "valueFrom" in switch or switch.get("value") == "1"


def database_secrets(spec: api.EmbeddingJobSpec) -> list[tuple[str, api.SecretKeyRef, str]]:
    """(driver env variable, Secret key, spec field) of each database the driver connects to: the
    sink's, and a table source's own when it names one."""
    pairs = [(DATABASE_URL_ENV, spec.sink.database_secret_ref, "spec.sink.databaseSecretRef"),
             (SOURCE_DATABASE_URL_ENV, spec.source.database_secret_ref, "spec.source.databaseSecretRef")]
    return [(env, ref, field) for env, ref, field in pairs if ref is not None]


def _database_source(container: dict[str, Any], env: str) -> str:
    """Where the container's `env` (a database URL) comes from, in words (never the value)."""
    var = _env_var(container, env)
    if var is None:
        return f"it does not set {env}"
    ref = (var.get("valueFrom") or {}).get("secretKeyRef")
    if ref is not None:
        return f"it takes it from Secret {ref.get('name')!r} key {ref.get('key')!r}"
    if "valueFrom" in var:
        return f"it takes it from {', '.join(var['valueFrom'])}, not a Secret"
    return "it sets it to a literal value"


def check_shared_cluster(spec: api.EmbeddingJobSpec, raycluster: dict[str, Any] | None) -> Verdict | None:
    """A job on an existing RayCluster (spec.clusterSelector) writes to the database its own
    Secret names: the driver's container must take DATABASE_URL_ENV from that Secret's key, and
    a table source's SOURCE_DATABASE_URL_ENV from its Secret's key (else the driver would read
    a same-named table of the sink's database).

    The URL never travels in the RayJob or in Ray job metadata, which every user of a shared
    cluster can read. KubeRay's clusterSelector names the RayCluster in the job's namespace by
    `ray.io/cluster` and ignores every other key, so other keys must be labels of that cluster.
    The driver runs on the head's Ray container, or on any node when the head lets Ray place
    drivers on workers; each container it may run in is checked.
    """
    if not spec.cluster_selector:
        return None
    name = selected_cluster(spec)
    if raycluster is None:
        return _reject("SharedClusterNotFound",
                       f"RayCluster {name!r} (spec.clusterSelector {api.RAY_CLUSTER_SELECTOR_KEY}) "
                       "does not exist in the job's namespace")
    labels = (raycluster.get("metadata") or {}).get("labels") or {}
    unmatched = [f"{key}={value}" for key, value in sorted(spec.cluster_selector.items())
                 if key != api.RAY_CLUSTER_SELECTOR_KEY and labels.get(key) != value]
    if unmatched:
        return _reject("SharedClusterSelectorMismatch",
                       f"RayCluster {name!r} does not have the labels {', '.join(unmatched)} of spec.clusterSelector "
                       f"(KubeRay selects the cluster by {api.RAY_CLUSTER_SELECTOR_KEY} alone)")
    ray_spec = raycluster.get("spec") or {}
    head_group = ray_spec.get("headGroupSpec") or {}
    groups = [("head group", head_group)]
    if _driver_may_run_on_workers(_ray_container(head_group)):
        groups += [(f"worker group {group.get('groupName')!r}", group)
                   for group in ray_spec.get("workerGroupSpecs") or []]
    for (described, group), (env, ref, field) in itertools.product(groups, database_secrets(spec)):
        container = _ray_container(group)
        source = ((_env_var(container, env) or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
        if (source.get("name"), source.get("key")) != (ref.name, ref.key):
            others = [other.get("name") for other in _containers(group)[RAY_CONTAINER_INDEX + 1:]
                      if _env_var(other, env)]
            elsewhere = f" (container {others[0]!r} sets it, but Ray runs in the first container)" if others else ""
            return _reject(
                "SharedClusterDatabaseMismatch",
                f"RayCluster {name!r}: the {described}'s Ray container {container.get('name', '(none)')!r} must set "
                f"{env} from Secret {ref.name!r} key {ref.key!r} (env[].valueFrom.secretKeyRef; "
                f"{field}), since the job's driver may run there; "
                f"{_database_source(container, env)}{elsewhere}")
    return None


def check_pod_policy(spec: api.EmbeddingJobSpec, policy: PodPolicy) -> Verdict | None:
    """The pod policy, for clusters without its admission policy (which refuses the same at apply time)."""
    found = violations(spec, policy)
    return _reject("PodPolicyViolation", "; ".join(found)) if found else None


def parse(spec: dict[str, Any]) -> api.EmbeddingJobSpec | Verdict:
    """The parsed spec, or an `InvalidSpec` rejection naming the fields."""
    try:
        return api.parse_spec(spec)
    except api.SpecError as exc:
        return _reject("InvalidSpec", str(exc))


def check_scheduled_name(name: str, spec: api.EmbeddingJobSpec) -> Verdict | None:
    """A scheduled job's runs are named <name>-<minutes since the epoch>: the name leaves room for it."""
    if spec.schedule is None or len(name) <= api.MAX_SCHEDULED_NAME:
        return None
    return Verdict(False, "NameTooLong", f"a scheduled job's name has at most {api.MAX_SCHEDULED_NAME} characters: "
                   "its runs are named <name>-<minutes since the epoch> (63 at most)")


def review_without_cluster(spec: api.EmbeddingJobSpec, policy: PodPolicy) -> Verdict | None:
    """The part of the review that needs nothing from the cluster, the pod policy included (`embedjob render`
    runs it alone, with the policy of the operator's settings)."""
    return ((check_source(spec.source.uri) if spec.source.uri else None) or check_model(spec.model)
            or check_pod_policy(spec, policy))


def review(spec: api.EmbeddingJobSpec, secret: dict[str, Any] | None,
           raycluster: dict[str, Any] | None = None, policy: PodPolicy = PodPolicy()) -> Verdict:
    """Review a parsed spec, its database Secret (None: the Secret does not exist), for a
    job with spec.clusterSelector the RayCluster it selects (None: it does not exist), and its
    pod settings against the pod policy (the restrictive one unless given)."""
    return (review_without_cluster(spec, policy) or check_secret(spec.sink, secret)
            or check_shared_cluster(spec, raycluster) or ACCEPTED)
