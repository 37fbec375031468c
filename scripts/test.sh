#!/usr/bin/env bash
# Run every test on a fresh machine: install what is missing, build (or reuse) the real
# control plane, lint, type-check, then pytest against kube-apiserver + etcd with RBAC on.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in go npm python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool: install it first (Go >= 1.26, Node.js with npm, Python >= 3.10)" >&2; exit 1; }
done
echo "== installing Python packages"
python3 -m pip install --quiet --disable-pip-version-check -e '.[tensorplay,operator,test]'
echo "== control-plane binaries (cached in ${KUBE_RENDEZVOUS_CACHE:-~/.cache/kube-rendezvous})"
python3 -m tests.testenv build
echo "== ruff and mypy"
python3 -m ruff check .
python3 -m mypy
echo "== pytest"
exec python3 -m pytest "$@"
