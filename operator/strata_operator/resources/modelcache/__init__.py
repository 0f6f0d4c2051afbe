"""Pure builders for a ModelCache's children and status: spec in, Kubernetes objects out, no I/O."""
