//go:build tools

// Package tools pins the upstream commands this module builds.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kubelet/app"
	_ "k8s.io/kubernetes/cmd/kube-proxy/app"
	_ "k8s.io/kubernetes/cmd/kubeadm/app"
	_ "k8s.io/kubectl/pkg/cmd"
)
