"""`python -m controller`: the EmbeddingJob operator.

kopf runs standalone (one replica, no peering), keeps its handler progress and
diff-base in `embedjob.dev/*` annotations, and guards each job with the finalizer
`embedjob.dev/cleanup`. Settings come from the environment (controller/settings.py).
"""

from __future__ import annotations

import asyncio
import logging

import kopf

from embedjob import api

from . import handlers  # noqa: F401  (registers the handlers with kopf)
from . import metrics
from .kube import KubeApi
from .pool_leases import LeaseStore
from .pool_sweeper import PoolSweeper
from .reconcile import Context, StatusKeeper
from .release import FINALIZER
from .run_reader import RunReader
from .settings import Settings

LOG_FORMATS = {"json": kopf.LogFormat.JSON, "plain": kopf.LogFormat.FULL}


def kopf_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=api.GROUP, key="last-handled-configuration"
    )
    # Only the explicit Events of the status transitions, not one per log line.
    settings.posting.loggers = False
    settings.posting.level = logging.INFO
    return settings


def main() -> None:
    settings = Settings.from_env()
    kopf.configure(log_format=LOG_FORMATS[settings.log_format])
    metrics.serve(settings.metrics_port)
    runs = RunReader(settings.database_url) if settings.database_url else None
    leases = LeaseStore(settings.database_url) if settings.database_url else None
    kube = KubeApi.from_environment()
    context = Context(
        settings=settings,
        kube=kube,
        runs=runs,
        job_states=metrics.JobStates(),
        pool_sweeper=PoolSweeper(settings, kube, leases) if leases is not None else None,
    )
    try:
        asyncio.run(run(settings, context))
    finally:
        for store in (runs, leases):
            if store is not None:
                store.close()


async def run(settings: Settings, context: Context) -> None:
    """kopf's operator, and beside it the sweep of idle actor pools."""
    sweep = asyncio.create_task(context.pool_sweeper.run()) if context.pool_sweeper is not None else None
    try:
        await kopf.operator(
            settings=kopf_settings(),
            standalone=True,
            clusterwide=settings.clusterwide,
            namespaces=list(settings.watch_namespaces),
            liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz",
            memo=kopf.Memo(context=context, keeper=StatusKeeper(context, handlers.post_event)),
        )
    finally:
        if sweep is not None:
            sweep.cancel()


if __name__ == "__main__":
    main()
