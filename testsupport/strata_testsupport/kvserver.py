"""Session fixtures: kvserver (filled in by its component)."""
