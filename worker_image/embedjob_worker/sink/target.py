"""Where a job's vectors go (SinkTarget): its job key, collection, vectors table, vector type and content salt."""

from __future__ import annotations

from dataclasses import dataclass

from embedjob import db

from embedjob_worker.core.config import JobConfig
from embedjob_worker.sink.copy_data import content_salt


@dataclass(frozen=True)
class SinkTarget:
    """The same for every run of the job; a writer actor gets it as it is (it pickles)."""

    job_key: str
    collection: str
    table: str
    salt: bytes  # copy_data.content_salt: part of every content hash
    vector_type: str = "vector"  # one of db.VECTOR_TYPES

    def __post_init__(self) -> None:
        if self.vector_type not in db.VECTOR_TYPES:
            raise ValueError(f"vector type {self.vector_type!r} is not one of {', '.join(db.VECTOR_TYPES)}")

    @classmethod
    def of_job(cls, config: JobConfig) -> SinkTarget:
        """The target spec.sink names, salted with the model settings a vector depends on beyond its text."""
        spec = config.spec
        return cls(config.job_key, spec.sink.collection, spec.sink.table,
                   content_salt(spec.model.normalize, spec.model.max_seq_length, spec.chunking),
                   spec.sink.vector_type)
