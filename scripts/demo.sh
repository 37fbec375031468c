#!/usr/bin/env bash
# The demo: local control plane + operator + a 3-agent elastic tensorplay job that loses a pod.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python scripts/demo.py "$@"
