"""chaos/scenarios."""
