"""Shared pytest plugins: the real PostgreSQL and the real Kubernetes control plane."""

pytest_plugins = ["pg_fixtures", "envtest.plugin", "operator_fixtures", "pool_fixtures"]
