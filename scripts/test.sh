#!/usr/bin/env bash
# Run every test on a fresh machine: install what is missing into .venv, build (or reuse) the
# real control plane, lint, type-check, then pytest against kube-apiserver + etcd with RBAC on.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in go npm python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool: install it first (Go >= 1.26, Node.js with npm, Python >= 3.10)" >&2; exit 1; }
done
echo "== Python packages (into .venv)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[tensorplay,operator,test]'
PY=.venv/bin/python
echo "== control-plane binaries (cached in ${KUBE_RENDEZVOUS_CACHE:-~/.cache/kube-rendezvous})"
$PY -m tests.testenv build
echo "== ruff and mypy"
$PY -m ruff check .
$PY -m ruff format --check .
$PY -m mypy
echo "== pytest"
exec $PY -m pytest "$@"
