"""Names of the driver's Ray actors: a job's own (EmbeddingWorker, GroupWriter) and a shared pool's.

The name patterns live here once: the encode stage starts the workers and pool actors, the
sink stage its writers, and pool removal finds a pool's actors by the same pattern.
"""

from __future__ import annotations

import hashlib

# The Ray namespace of the detached pool actors on a shared cluster.
POOL_NAMESPACE = "embedjob"


def worker_actor_name(job_key: str, slot: int, generation: int, role: str = "worker") -> str:
    """Name of a job's own actor (an EmbeddingWorker, or a `writer`) in a slot; a replacement after a crash
    gets the next generation."""
    return f"embedjob-{role}-{hashlib.sha256(job_key.encode()).hexdigest()[:8]}-{slot}-{generation}"


def pool_actor_name(pool: str, slot: int) -> str:
    """The detached actor of `pool` in `slot`."""
    return f"{pool}-{slot}"


def is_pool_actor(pool: str, name: str) -> bool:
    """Whether `name` is pool_actor_name(pool, slot) for some slot."""
    prefix = f"{pool}-"
    return name.startswith(prefix) and name[len(prefix):].isdigit()
