//go:build tools

// Package tools pins the container runtime the real node runs: containerd, its runc shim and ctr (the packages
// their main packages import, so `go mod tidy` keeps every module they need).
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task/plugin"
	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
	_ "github.com/containerd/containerd/v2/cmd/containerd/command"
	_ "github.com/containerd/containerd/v2/cmd/ctr/app"
)
