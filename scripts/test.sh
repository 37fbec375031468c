#!/usr/bin/env bash
# Run every test: lint, type-check, then pytest against a real kube-apiserver + etcd with RBAC on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=.venv/bin/python
echo "== workload controllers: JobSet, Kubeflow Trainer, Kueue (cached like the control plane; cold: ~6 min)"
$PY -m tests.testenv build --workloads >/dev/null
echo "== ruff and mypy"
$PY -m ruff check .
$PY -m ruff format --check .
$PY -m mypy
echo "== pytest"
exec $PY -m pytest "$@"
