"""Pure builders for a KVCacheTier's children: spec in, Kubernetes objects out, no API calls.

Each module builds one kind of child; `children.build_children` assembles them in apply order.
"""
