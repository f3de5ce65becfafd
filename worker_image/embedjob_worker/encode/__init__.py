"""Stage `encode`: the model and its backends, the tokenizer, the EmbeddingWorker actors, shared pools and
their leases, and dispatch with at most maxInFlight batches. Imports `core`, `source` and `plan`; the only
stage that imports torch and sentence-transformers."""
