"""Root pytest configuration: loads the shared fixtures for real servers (control plane, S3, Hub, kvserver, OCI
registry)."""

pytest_plugins = [
    "strata_testsupport.cluster",
    "strata_testsupport.s3",
    "strata_testsupport.hub",
    "strata_testsupport.kvserver",
    "strata_testsupport.realnode",
    "strata_testsupport.webhook",
    "strata_testsupport.registry",  # after webhook, whose certificates it uses
]
