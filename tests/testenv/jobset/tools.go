//go:build tools

// Package jobset pins the jobset controller that the workload tests run (built by tests/testenv/binaries.py).
package jobset

import _ "sigs.k8s.io/jobset"
