"""The job's EmbeddingWorker actors: started (its own, or a shared pool's), awaited, replaced when lost."""

from __future__ import annotations

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from embedjob_worker.core.actor_names import POOL_NAMESPACE, pool_actor_name, worker_actor_name
from embedjob_worker.encode.actors import EmbeddingWorker
from embedjob_worker.core.config import JobConfig
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.worker_reports import WorkerInfo
from embedjob_worker.encode.exported import model_for_actors
from embedjob_worker.encode.lease import PoolLease
from embedjob_worker.encode.model import ResolvedModel


class ActorSet:
    """`replicas` EmbeddingWorker actors, one per slot; a dead one is replaced by a fresh one in its slot.

    With a pool `lease` (a job on an existing cluster) the actors are the detached pool's
    `<pool>-<slot>`, got if they exist (another job's, model loaded) or created; they
    outlive this job and are removed by the operator once no job leases the pool. A
    replacement is created only after the lease is confirmed (LeaseLost otherwise).
    Without, they are this job's own and are killed at its end.
    """

    def __init__(self, config: JobConfig, resolved: ResolvedModel, fault_injection: dict | None,
                 lease: PoolLease | None = None):
        workers = config.spec.workers
        self._actor_class = ray.remote(EmbeddingWorker)
        self.lease = lease
        self.shared_pool = lease.pool if lease else None
        # Retries are the driver's (bounded, recorded); Ray must not silently restart or re-run.
        self._actor_options = dict(num_cpus=workers.cpus_per_actor, num_gpus=workers.gpus_per_actor,
                                   max_restarts=0, max_task_retries=0)
        if self.shared_pool:
            # get_if_exists: jobs starting together end up with the same actors, not a name clash.
            self._actor_options.update(lifetime="detached", namespace=POOL_NAMESPACE, get_if_exists=True)
        self._args = (resolved, model_for_actors(resolved), workers.cpus_per_actor, workers.gpus_per_actor,
                      fault_injection)
        self.job_key = config.job_key
        self.generations = [0] * workers.replicas
        self.actors = [self._start(slot) for slot in range(workers.replicas)]
        self.outstanding = [0] * workers.replicas  # batches each slot's actor is working on

    def _start(self, slot: int):
        name = self.actor_name(slot)
        return self._actor_class.options(name=name, **self._actor_options).remote(*self._args)

    def actor_name(self, slot: int) -> str:
        if self.shared_pool:  # a dead pool actor's name is free again: its replacement takes it
            return pool_actor_name(self.shared_pool, slot)
        return worker_actor_name(self.job_key, slot, self.generations[slot])

    def wait_ready(self, timeout_s: float) -> list[WorkerInfo]:
        """Each actor's info() once it has loaded the model."""
        try:
            return ray.get([actor.info.remote() for actor in self.actors], timeout=timeout_s)
        except GetTimeoutError:
            raise JobFailed("WorkersUnavailable", f"EmbeddingWorker actors not ready after {timeout_s:.0f}s "
                            "(not enough CPUs/GPUs in the Ray cluster?)") from None
        except (RayActorError, RayTaskError) as exc:
            raise JobFailed("WorkersUnavailable", f"an EmbeddingWorker actor failed to start: {exc}") from None

    def least_loaded(self) -> int:
        return min(range(len(self.actors)), key=self.outstanding.__getitem__)

    def check_lease(self) -> None:
        """LeaseLost once the pool's lease is lost; nothing for a job's own actors."""
        if self.lease:
            self.lease.check()

    def replace(self, slot: int, dead_actor) -> None:
        if self.actors[slot] is dead_actor:  # not yet replaced by another failed task of the same actor
            if self.lease:  # a pool actor no lease covers would never be removed
                self.lease.confirm()
            self.generations[slot] += 1
            self.actors[slot] = self._start(slot)

    def shutdown(self) -> None:
        if self.shared_pool:
            return
        for actor in self.actors:
            ray.kill(actor)
