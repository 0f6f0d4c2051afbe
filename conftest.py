"""Root pytest configuration: loads the shared fixtures for real servers (control plane, S3, Hub, kvserver, OCI
registry) and tools (kstatus, the Argo CD health check)."""

pytest_plugins = [
    "strata_testsupport.cluster",
    "strata_testsupport.s3",
    "strata_testsupport.hub",
    "strata_testsupport.kvserver",
    "strata_testsupport.csi",  # after cluster: the CSI plugin's control plane (csi_cluster)
    "strata_testsupport.webhook",
    "strata_testsupport.registry",  # after webhook, whose certificates it uses
    "strata_testsupport.realnode",  # after registry, which it starts on the node's address
    "strata_testsupport.gitops",  # kstatus (Flux) and the Argo CD health check
]
