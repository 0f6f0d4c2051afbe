"""A real Kubernetes control plane on loopback (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok), built from the upstream Go modules, for tests and `make demo`."""

from strata_testsupport.localcluster.binaries import BinariesNotFound, ControlPlaneBinaries, find_binaries
from strata_testsupport.localcluster.cluster import LocalCluster

__all__ = ["BinariesNotFound", "ControlPlaneBinaries", "LocalCluster", "find_binaries"]
