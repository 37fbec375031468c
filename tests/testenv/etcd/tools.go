//go:build tools

// Package etcd pins the etcd server that the test control plane runs (built by tests/testenv/binaries.py).
package etcd

import _ "go.etcd.io/etcd/server/v3"
