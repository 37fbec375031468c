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
# Parallel workers (pytest-xdist): the tests that need the machine's nodes or networks run in one group, each other
# module in a group of its own, the longest first (tests/conftest.py). TEST_WORKERS=0 runs everything in this process.
WORKERS="${TEST_WORKERS:-3}"
echo "== pytest ($WORKERS parallel workers)"
if [ "$WORKERS" = "0" ]; then
  exec $PY -m pytest "$@"
fi
exec $PY -m pytest -n "$WORKERS" --dist loadscope --no-loadscope-reorder "$@"
