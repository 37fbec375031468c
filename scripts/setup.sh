#!/usr/bin/env bash
# Install everything the tests and the demo need on a fresh machine (idempotent):
# Python packages into .venv, then the control-plane binaries into the cache outside the repo.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in go npm python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool: install it first (Go >= 1.26, Node.js with npm, Python >= 3.10)" >&2; exit 1; }
done
if ! command -v iptables >/dev/null || ! command -v ip >/dev/null; then
  # Pods with networks of their own (tests/testenv/podnet.py): iproute2 for namespaces, iptables for faults.
  echo "== Debian packages: iproute2 iptables (network namespaces and packet-level faults in the tests)"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 iptables \
      || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 iptables; }
  else
    echo "   not root or no apt-get: install iproute2 and iptables yourself (tests/test_network.py needs them)" >&2
  fi
fi
echo "== Python packages (into .venv)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[tensorplay,torch,operator,test]'
echo "== control-plane binaries (cached in ${KUBE_RENDEZVOUS_CACHE:-~/.cache/kube-rendezvous})"
.venv/bin/python -m tests.testenv build
