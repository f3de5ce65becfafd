"""What an EmbeddingWorker actor reports across Ray: its model once loaded (WorkerInfo), a batch embedded
(EmbedResult), a reduced precision compared with float32 (PrecisionCheck).

The actor (encode/actors.py) builds them and the driver (encode/workers.py, encode/dispatch.py,
run/job.py) reads them; they pickle by this module's name, which the driver and the actors share
(one embedjob_worker). Ray carries a result's numpy vectors as they are, without a copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WorkerInfo:
    """An actor that has loaded its model (EmbeddingWorker.info)."""

    model: str
    revision: str  # recomputed from the files on the actor's node
    dimension: int  # of the vectors it returns: spec.model.dimensions where set, else the model's
    model_dimension: int  # the model's own, which spec.model.dimensions may not exceed
    max_tokens: int  # the model's max_seq_length: a longer text is embedded truncated
    load_seconds: float
    loaded_at: float  # wall clock: a shared pool's actor may have loaded the model for another job
    actor_id: str
    worker: str  # host/pid/actor id, as attempt and batch rows name it


@dataclass(frozen=True)
class EmbedResult:
    """A batch embedded (EmbeddingWorker.embed), tagged with the model and revision that embedded it."""

    batch_id: str
    truncated: tuple[int, ...]  # the indices of the texts longer than max_tokens
    model: str
    revision: str
    worker: str
    seconds: float
    oom_splits: int  # times the batch, or a part of it, was split in halves after running out of memory
    # float32, a row per text; None where the vectors are returned apart (EmbeddingWorker.embed_apart)
    vectors: np.ndarray | None = None
    largest: tuple[float, ...] = ()  # each vector's largest component magnitude (core.vector_range)


@dataclass(frozen=True)
class PrecisionCheck:
    """The cosines between a reduced precision's vectors and float32's of the same texts (EmbeddingWorker.check_precision)."""

    texts: int
    mean: float
    minimum: float
