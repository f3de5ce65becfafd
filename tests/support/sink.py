"""A job's sink opened on a test database as the driver opens it: one engine for the job's runs and batch writes."""

from dataclasses import dataclass

import sqlalchemy as sa

from embedjob import schema
from embedjob_worker.sink.postgres import PostgresSink, open_engine
from embedjob_worker.sink.runs import JobRuns
from embedjob_worker.sink.target import SinkTarget
from embedjob_worker.sink.vectors_table import ensure_vectors_table


@dataclass(frozen=True)
class OpenJob:
    engine: sa.Engine
    target: SinkTarget
    runs: JobRuns
    sink: PostgresSink

    def close(self) -> None:
        self.engine.dispose()


def open_job(url: str, target: SinkTarget, job_name: str, namespace: str, dim: int | None = None,
             migrate: bool = True) -> OpenJob:
    """The job's runs and batch writes on one engine, after the migrations (unless `migrate` is false) and, with
    `dim`, the vectors table created."""
    if migrate:
        schema.migrate(url)
    engine = open_engine(url)
    target = target.in_schema_of(engine)
    if dim is not None:
        ensure_vectors_table(engine, target.vectors, dim, target.vector_type)
    return OpenJob(engine, target, JobRuns(engine, target, job_name, namespace), PostgresSink(engine, target))
