"""Stage `sink`: PostgreSQL — the job lock, the run's life, batch and vector writes, the vectors table and
its index, incremental runs, seen ids, the writer thread and writer actors. Imports the stages below it
(`core`, `source`, `plan`, `encode`); no torch or sentence-transformers."""
