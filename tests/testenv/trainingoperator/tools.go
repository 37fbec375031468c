//go:build tools

// Package trainingoperator pins the training-operator that the workload tests run (built by tests/testenv/binaries.py).
package trainingoperator

import _ "github.com/kubeflow/training-operator/cmd/training-operator.v1"
