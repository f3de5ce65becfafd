"""Detached EmbeddingWorker pools on shared Ray clusters: their names, and their removal.

A job on an existing RayCluster (`spec.clusterSelector`) does not start its own actors:
it gets or creates the detached, named actors `<pool>-0 .. <pool>-(n-1)` in the Ray
namespace `embedjob`, where the pool name is a hash of everything that makes two
actors interchangeable (model, revision, resources, normalisation, token limit). Later
jobs with the same model find the model already loaded.

Detached actors outlive their creator; each job leases the pool while it runs
(`embedjob_worker.encode.lease`). The operator removes a pool once no live lease remains,
through the entrypoint `embedjob_worker.pools` run on the cluster:

    python -m embedjob_worker.pools remove --pool NAME
"""

from __future__ import annotations

import hashlib
import json

from embedjob.api import RAY_CLUSTER_SELECTOR_KEY

from embedjob_worker.core.actor_names import POOL_NAMESPACE, is_pool_actor
from embedjob_worker.core.config import JobConfig
from embedjob_worker.encode.model import ResolvedModel

POOL_HASH_CHARS = 16


def pool_name(resolved: ResolvedModel, cpus: float, gpus: float) -> str:
    """`pool-<hash>` of what makes two actors interchangeable; another model or revision never matches."""
    identity = json.dumps([resolved.name, resolved.revision, float(cpus), float(gpus), resolved.normalize,
                           resolved.max_seq_length])
    return "pool-" + hashlib.sha256(identity.encode()).hexdigest()[:POOL_HASH_CHARS]


def shared_cluster(config: JobConfig) -> str | None:
    """`<namespace>/<RayCluster>` of a job on an existing cluster; None when the job has its own."""
    selector = config.spec.cluster_selector
    if not selector:
        return None
    return f"{config.namespace}/{selector[RAY_CLUSTER_SELECTOR_KEY]}"


def remove_pool(pool: str) -> list[str]:
    """Kill the pool's actors on the Ray cluster this process is connected to; their names."""
    import ray

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == POOL_NAMESPACE and is_pool_actor(pool, a["name"])]
    for name in names:
        try:
            ray.kill(ray.get_actor(name, namespace=POOL_NAMESPACE), no_restart=True)
        except ValueError:  # died meanwhile
            continue
    return names
