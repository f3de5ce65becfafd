"""Whether vectors can be stored: every component finite and within the range of the sink's pgvector type.

A model in half precision or int8 can give a NaN or an infinite component, and a float32 one
can hold a component that float16 (halfvec) cannot; pgvector refuses such a vector, and the
refused COPY would fail a whole group of batches without naming the record. The actor reports
each vector's largest component magnitude (one float per vector: a vector never crosses Ray
twice to be checked), and the driver fails the batch that holds one out of range, naming its
record, before anything is written; the COPY data is checked again as the last guard.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# The largest component magnitude each vector type stores (embedjob.vector_types.VECTOR_TYPES): float32's, float16's (65504).
LARGEST_COMPONENT = {"vector": float(np.finfo(np.float32).max), "halfvec": float(np.finfo(np.float16).max)}


def largest_components(vectors: np.ndarray) -> tuple[float, ...]:
    """Each vector's largest component magnitude: NaN where a component is NaN, inf where one is infinite."""
    if not len(vectors):
        return ()
    return tuple(float(m) for m in np.abs(np.asarray(vectors, dtype=np.float32)).max(axis=1))


def out_of_range(largest: Sequence[float], vector_type: str) -> list[int]:
    """The indices of the vectors that `vector_type` cannot store."""
    limit = LARGEST_COMPONENT[vector_type]
    return [i for i, m in enumerate(largest) if not m <= limit]  # NaN compares False


def why_out_of_range(largest: float, vector_type: str) -> str:
    """What is wrong with a vector whose largest component magnitude is `largest`."""
    if math.isnan(largest):
        return "a component is NaN"
    if math.isinf(largest):
        return "a component is infinite"
    return (f"a component ({largest:.6g}) is beyond {vector_type}'s range (±{LARGEST_COMPONENT[vector_type]:.0f})"
            + ("; use vectorType vector" if vector_type == "halfvec" else ""))
