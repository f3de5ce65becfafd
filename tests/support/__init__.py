"""Plain helpers that the test tiers share: no fixtures, nothing started on import, no Ray or torch imported."""
