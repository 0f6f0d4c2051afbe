"""Pure builders: a custom resource's spec in, its child objects out (no API calls)."""
