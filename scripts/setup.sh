#!/usr/bin/env bash
# Install everything the tests and the demo need on a fresh machine (idempotent):
# Python packages into .venv, then the control-plane binaries into the cache outside the repo.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in go npm python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool: install it first (Go >= 1.26, Node.js with npm, Python >= 3.10)" >&2; exit 1; }
done
echo "== Python packages (into .venv)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[tensorplay,torch,operator,test]'
echo "== control-plane binaries (cached in ${KUBE_RENDEZVOUS_CACHE:-~/.cache/kube-rendezvous})"
.venv/bin/python -m tests.testenv build
