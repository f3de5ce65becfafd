"""Stage `core`: the vocabulary every stage shares (config, records, outcomes, errors, logs, metrics,
counts, actor names, what the actors report). Imports no stage; no Ray, torch or sentence-transformers."""
