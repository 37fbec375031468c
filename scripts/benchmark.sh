#!/usr/bin/env bash
# Benchmarks beside p10d on a local control plane; writes docs/benchmarks.md, docs/benchmarks.png and
# benchmarks/results/results.json. Extra arguments go to python -m benchmarks.run (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m benchmarks.run "$@"
