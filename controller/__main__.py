"""`python -m controller`: the EmbeddingJob operator.

kopf runs standalone (one replica, no peering), keeps its handler progress and
diff-base in `embedjob.dev/*` annotations, and guards each job with the finalizer
`embedjob.dev/cleanup`. Settings come from the environment (controller/settings.py).
"""

from __future__ import annotations

import asyncio
import logging
import sys

import kopf

from embedjob import api

from . import handlers  # noqa: F401  (registers the handlers with kopf)
from . import metrics
from .kube import EVENT_SOURCE, REQUEST_TIMEOUT, KubeApi, api_client
from .pool_leases import LeaseStore
from .pool_sweeper import PoolSweeper
from .keeper import StatusKeeper
from .reconcile import Context
from .refusals import Refusals
from .release import FINALIZER, release_terminating_forever
from .run_reader import RunReader
from .scheduler import Scheduler
from .settings import Settings, SettingsError

LOG_FORMATS = {"json": kopf.LogFormat.JSON, "plain": kopf.LogFormat.FULL}
API_CONNECT_TIMEOUT_SECONDS, API_REQUEST_TIMEOUT_SECONDS = REQUEST_TIMEOUT
# The API server ends each watch after this long (an integer: a query parameter); kopf reconnects.
WATCH_SECONDS = 300


def kopf_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=api.GROUP, key="last-handled-configuration"
    )
    # Only the explicit Events of the status transitions, not one per log line; `kubectl
    # describe` shows them from the operator, as the Events the operator posts itself.
    settings.posting.loggers = False
    settings.posting.level = logging.INFO
    settings.posting.reporting_component = EVENT_SOURCE
    # No API call may hang for ever (aiohttp's default is 5 minutes, and no connect bound);
    # watches are ended by the server and reconnected, with a client-side bound above that.
    settings.networking.connect_timeout = API_CONNECT_TIMEOUT_SECONDS
    settings.networking.request_timeout = API_REQUEST_TIMEOUT_SECONDS
    settings.watching.connect_timeout = API_CONNECT_TIMEOUT_SECONDS
    settings.watching.server_timeout = WATCH_SECONDS
    settings.watching.client_timeout = WATCH_SECONDS + API_REQUEST_TIMEOUT_SECONDS
    return settings


def main() -> None:
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        sys.exit(f"embedjob-operator: {exc}")
    # Plain logs name the job of each line as [namespace/name]; JSON logs carry it as `object`.
    kopf.configure(log_format=LOG_FORMATS[settings.log_format], log_prefix=None)
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


def memo(context: Context) -> kopf.Memo:
    keeper = StatusKeeper(context)
    return kopf.Memo(context=context, keeper=keeper, scheduler=Scheduler(context, keeper),
                     refusals=Refusals(context.kube))


async def run(settings: Settings, context: Context) -> None:
    """kopf's operator, and beside it the sweep of idle actor pools and (watchNamespaces) the release of jobs
    whose namespace is being deleted."""
    tasks = [asyncio.create_task(context.pool_sweeper.run())] if context.pool_sweeper is not None else []
    if not settings.clusterwide:  # kopf cannot be relied on there: issue 26 item 4, docs/operator.md (Permissions)
        tasks.append(asyncio.create_task(release_terminating_forever(api_client(retries=0), settings.watch_namespaces)))
    try:
        await kopf.operator(
            settings=kopf_settings(),
            standalone=True,
            clusterwide=settings.clusterwide,
            namespaces=list(settings.watch_namespaces),
            liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz",
            memo=memo(context),
        )
    finally:
        for task in tasks:
            task.cancel()


if __name__ == "__main__":
    main()
