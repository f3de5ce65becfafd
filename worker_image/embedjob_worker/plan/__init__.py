"""Stage `plan`: record checks, chunking and deterministic batches, and the feed that hands on the batches
a run still has to embed. Imports `core` and `source`; no Ray."""
