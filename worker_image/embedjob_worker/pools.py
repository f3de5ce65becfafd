"""Detached EmbeddingWorker pools on shared Ray clusters, their leases, and their removal.

A job on an existing RayCluster (`spec.clusterSelector`) does not start its own actors:
it gets or creates the detached, named actors `<pool>-0 .. <pool>-(n-1)` in the Ray
namespace `embedjob`, where the pool name is a hash of everything that makes two
actors interchangeable (model, revision, resources, normalisation, token limit). Later
jobs with the same model find the model already loaded.

Detached actors outlive their creator, so each job holds a lease on the pool in
PostgreSQL (`embedjob_pool_leases`): acquired before the actors are touched,
heart-beaten with the run, released at the end. The operator removes a pool only when
no live lease remains, through the entrypoint of this module run on the cluster:

    python -m embedjob_worker.pools remove --pool NAME

Acquisition and removal take the same advisory lock (`embedjob.db.POOL_LOCK`), so
a job that starts while its pool is being removed waits and then creates new actors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import uuid

import sqlalchemy as sa

from embedjob import db
from embedjob.api import RAY_CLUSTER_SELECTOR_KEY

from .config import JobConfig
from .model import ResolvedModel

POOL_NAMESPACE = "embedjob"
POOL_HASH_CHARS = 16


def pool_name(resolved: ResolvedModel, cpus: float, gpus: float) -> str:
    """`pool-<hash>` of what makes two actors interchangeable; another model or revision never matches."""
    identity = json.dumps([resolved.name, resolved.revision, float(cpus), float(gpus), resolved.normalize,
                           resolved.max_seq_length])
    return "pool-" + hashlib.sha256(identity.encode()).hexdigest()[:POOL_HASH_CHARS]


def pool_actor_name(pool: str, slot: int) -> str:
    return f"{pool}-{slot}"


def shared_cluster(config: JobConfig) -> str | None:
    """`<namespace>/<RayCluster>` of a job on an existing cluster; None when the job has its own."""
    selector = config.spec.cluster_selector
    if not selector:
        return None
    return f"{config.namespace}/{selector[RAY_CLUSTER_SELECTOR_KEY]}"


def acquire_lease(engine: sa.Engine, pool: str, cluster: str, config: JobConfig, actors: int) -> str:
    """Record that this job uses the pool; waits while the operator is removing it."""
    lease_id = str(uuid.uuid4())
    with engine.begin() as conn:
        conn.execute(db.advisory_lock_sql("pg_advisory_xact_lock", db.POOL_LOCK),
                     {"name": db.pool_lock_name(cluster, pool)})
        conn.execute(db.pool_leases.insert().values(
            lease_id=lease_id, pool=pool, cluster=cluster, job_key=config.job_key, job_name=config.name,
            namespace=config.namespace, actors=actors))
    return lease_id


def heartbeat_lease(conn: sa.Connection, lease_id: str) -> None:
    leases = db.pool_leases
    conn.execute(leases.update().where(leases.c.lease_id == lease_id).values(heartbeat_at=sa.func.now()))


def release_lease(engine: sa.Engine, lease_id: str) -> None:
    leases = db.pool_leases
    with engine.begin() as conn:
        conn.execute(leases.update().where(leases.c.lease_id == lease_id)
                     .values(released_at=sa.func.now(), heartbeat_at=sa.func.now()))


def remove_pool(pool: str) -> list[str]:
    """Kill the pool's actors on the Ray cluster this process is connected to; their names."""
    import ray

    prefix = f"{pool}-"  # pool_actor_name(pool, slot) for any slot
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == POOL_NAMESPACE and a["name"].startswith(prefix)
             and a["name"][len(prefix):].isdigit()]
    for name in names:
        try:
            ray.kill(ray.get_actor(name, namespace=POOL_NAMESPACE), no_restart=True)
        except ValueError:  # died meanwhile
            continue
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedjob_worker.pools",
                                     description="Manage detached EmbeddingWorker pools (run on the Ray cluster).")
    commands = parser.add_subparsers(dest="command", required=True)
    remove = commands.add_parser("remove", help="kill every actor of a pool")
    remove.add_argument("--pool", required=True)
    args = parser.parse_args(argv)
    import ray

    # Run as a Ray job: RAY_ADDRESS points at this cluster, never a new local one.
    ray.init(address="auto", namespace=POOL_NAMESPACE, log_to_driver=False)
    print(json.dumps({"pool": args.pool, "removed": remove_pool(args.pool)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
