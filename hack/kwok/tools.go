//go:build tools

// Package tools keeps kwok's module in this module's graph so `go build` can name its main package.
package tools

import _ "sigs.k8s.io/kwok/pkg/kwok/cmd"
