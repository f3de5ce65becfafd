"""A sentence-transformers model that costs next to nothing, for runs at sizes the real model cannot reach here.

sentence-transformers' own `StaticEmbedding` (an embedding bag: the mean of one vector per token, no attention)
with random vectors of a small dimension (16 by default, so the vectors table stays small), over a tokenizer
that does next to nothing: each run of up to three digits is a token of its own, each stretch between them the
one unknown token. A text's vector is a fixed function of the numbers in it (the bench's records each carry
their own), the same at every run. Embedding costs the Rust tokenizer's batched call and a lookup (once, on a
busy machine: 29 µs of CPU a text of 250 characters, where MiniLM's WordPiece tokenizer alone took 122). Jobs on
it run through the real actors, driver, bookkeeping and PostgreSQL, so a benchmark measures everything but the
model.

Built at bench time (never committed). Its token limit is unbounded (`max_seq_length` is infinite), so the
actors look for no truncated text. A class of sentence-transformers itself: loading it runs no outside code.
"""

from __future__ import annotations

from pathlib import Path

UNKNOWN = "[UNK]"


def digits_tokenizer():
    """A tokenizer whose tokens are runs of up to three digits, and the unknown token for everything else."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocabulary = {UNKNOWN: 0}
    for width in (1, 2, 3):
        for number in range(10 ** width):
            vocabulary[f"{number:0{width}d}"] = len(vocabulary)
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token=UNKNOWN))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"\d{1,3}"), behavior="isolated")
    return tokenizer


def build_null_model(directory: Path, dimension: int = 16, seed: int = 0) -> Path:
    """Write the model into `directory` (created) and return it."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding

    torch.manual_seed(seed)
    embedding = StaticEmbedding(digits_tokenizer(), embedding_dim=dimension)
    SentenceTransformer(modules=[embedding], device="cpu").save(str(directory))
    return directory
