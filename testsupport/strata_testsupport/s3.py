"""Session fixtures: s3 (filled in by its component)."""
