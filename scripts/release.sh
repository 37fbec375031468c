#!/usr/bin/env bash
# Build the release artifacts of pyproject.toml's version into dist/ (or --dist DIR): the sdist and the wheel,
# the chart package (helm package) and the operator image from the Dockerfile (a docker-archive tarball), with
# SHA256SUMS; then print how to push them. --no-image skips the image, which needs root and buildah
# (scripts/setup.sh installs it). Run scripts/setup.sh once first. See scripts/release.py.
#   bash scripts/release.sh                      # dist/
#   IMAGE_REPOSITORY=registry.example.com/ml/rdzv-operator bash scripts/release.sh
# Helm: $HELM, else helm on PATH, else the test environment's (tests/testenv/binaries.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || { echo "no $PY: run bash scripts/setup.sh first (or set PYTHON)" >&2; exit 1; }
exec "$PY" -m scripts.release "$@"
