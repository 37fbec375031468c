//go:build tools

// Package kueue pins the kueue controller that the workload tests run (built by tests/testenv/binaries.py).
package kueue

import _ "sigs.k8s.io/kueue/cmd/kueue"
