"""Plain helpers that the test tiers share: no fixtures, no services, nothing heavy imported."""
