//go:build tools

// Package trainer pins the trainer controller that the workload tests run (built by tests/testenv/binaries.py).
package trainer

import _ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
