"""pytest plugins that start the services of the integration and cluster tiers (each tier's
conftest registers the ones it needs)."""
