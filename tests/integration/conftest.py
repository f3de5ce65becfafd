"""The integration tier: a real PostgreSQL with pgvector, local Ray heads, the packaged model, the object stores' servers."""

from pathlib import Path

import pytest

#: The tier's longest files (CI's --durations), longest first. tests/run hands files to its two processes in
#: collection order (--dist loadfile --no-loadscope-reorder): these go first, so the run does not end on one
#: long file while the other process idles.
LONGEST_FIRST = (
    "test_cli_run.py", "test_table_source.py", "test_model_backends.py", "test_vector_index_run.py",
    "test_revision_switch.py", "test_readme_commands.py", "test_pools.py", "test_driver_hardening.py",
    "test_driver.py", "test_s3_datasets.py", "test_driver_writers.py", "test_postgres_restart.py",
    "test_bench_gpu.py", "test_prompts_dimensions.py",
)


def pytest_configure(config):
    missing = [name for name in LONGEST_FIRST if not (Path(__file__).parent / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/integration/conftest.py LONGEST_FIRST names no file: {missing}")
    # a conftest below the rootdir may not set pytest_plugins: register this tier's plugins here
    for plugin in ("plugins.postgres", "plugins.ray_heads", "plugins.s3", "plugins.gcs", "plugins.azure",
                   "plugins.http_files"):
        config.pluginmanager.import_plugin(plugin)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: a file's tests keep their order, the other files theirs
