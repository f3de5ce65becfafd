"""Stage `source`: reading the input (JSONL, CSV, Parquet files, local or in an object store; a PostgreSQL
table) as RawRecords, and the input's snapshot. Imports `core` only; no Ray."""
