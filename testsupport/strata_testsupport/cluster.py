"""Session fixtures: cluster (filled in by its component)."""
