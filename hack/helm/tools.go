//go:build tools

// Package tools keeps helm's module in this module's graph so `go build` can name its main package.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
