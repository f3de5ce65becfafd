"""The integration tier: a real PostgreSQL with pgvector, local Ray heads, the packaged model, the object stores' servers."""


def pytest_configure(config):
    # a conftest below the rootdir may not set pytest_plugins: register this tier's plugins here
    for plugin in ("plugins.postgres", "plugins.ray_heads", "plugins.s3", "plugins.gcs", "plugins.azure",
                   "plugins.http_files"):
        config.pluginmanager.import_plugin(plugin)
