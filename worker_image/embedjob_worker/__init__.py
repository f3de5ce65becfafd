"""The embedding driver: the RayJob entrypoint and the pipeline it runs, a folder per stage.

Stages, lowest first; a stage imports only the ones below it (tests/unit/test_layers.py
keeps this):

- `core/`   the vocabulary every stage shares: the job config, records, finished batches,
            failures, logs, metrics, the run's counts, actor names, what the EmbeddingWorker
            actors report. Imports no stage.
- `source/` reading the input: files (local or fsspec), a PostgreSQL table, the input's snapshot.
- `plan/`   record checks, length-sorted and token-budget batches, chunking, the feed.
- `encode/` the model and its backends, the tokenizer, the EmbeddingWorker actors, dispatch
            with bounded in-flight batches, shared pools and their leases.
- `sink/`   PostgreSQL: the job lock, runs, batch and vector writes (COPY), the vectors table
            and its index, incremental runs, seen ids, the writer thread and writer actors.
- `run/`    the wiring of one job from the stages, and its end.

Only `encode/` imports torch and sentence-transformers; `core/`, `source/` and `plan/`
import no Ray. The entrypoints that `embedjob.contract` names sit at the top:
`driver.py` (DRIVER_MODULE) and `pools.py` (POOLS_MODULE). The user's CLI is the package
`embedjob_cli`; nothing here imports it, the operator (`controller`), kopf or the
Kubernetes client.
"""
