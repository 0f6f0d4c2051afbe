"""Custom resource types: pydantic models that are the single source of truth for the CRDs."""

GROUP = "strata.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
