"""bench/null_model.py: the model bench/scale.py embeds with, loaded as the actors load it (sentence-transformers
imports transformers, which the unit tier keeps out of its processes)."""

from __future__ import annotations

import sys

import numpy as np
from sentence_transformers import SentenceTransformer

from support.paths import REPO

sys.path.insert(0, str(REPO / "bench"))
from null_model import build_null_model  # noqa: E402


def test_the_null_model_gives_each_text_one_unit_vector_of_its_dimension(tmp_path):
    model = SentenceTransformer(str(build_null_model(tmp_path / "null", dimension=16)), device="cpu")
    texts = ["PEP 8 is the style guide", "PEP 8 is the style guide", "PEP 20, the Zen of Python", "é 🙂 \u0000"]
    vectors = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    again = SentenceTransformer(str(build_null_model(tmp_path / "again", dimension=16)), device="cpu").encode(
        texts, normalize_embeddings=True, convert_to_numpy=True)
    assert vectors.shape == (4, 16) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert np.array_equal(vectors[0], vectors[1]) and not np.allclose(vectors[0], vectors[2])
    assert np.array_equal(vectors, again)  # built from a seed: the same vectors at every run
    assert model.max_seq_length == float("inf")  # the actors look for no truncated text
