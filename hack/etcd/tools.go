//go:build tools

// Package tools keeps etcd's server module in this module's graph so `go build` can name its main package.
package tools

import _ "go.etcd.io/etcd/server/v3/etcdmain"
