# The kube-rendezvous operator image (charts/kube-rendezvous runs it), tagged with pyproject.toml's version:
#   docker build -t ghcr.io/kube-rendezvous/operator:$VERSION .
# (scripts/release.sh builds it into dist/ without Docker, the way described below; README "Install").
# BASE_IMAGE lets a locally built base stand in for the official one (any image with python, pip,
# groupadd and useradd on PATH, where pip may install system-wide), e.g. without a registry:
#   buildah bud --isolation chroot --build-arg BASE_IMAGE=localhost/my/python-base:tag -t my/operator .
# tests/testenv/operator_image.py builds such a base (debootstrap) and the image this way, for the test node.
# Stage 1 builds a wheel of this repository; stage 2 installs it with the operator extra
# (Kopf, prometheus-client) and runs as an unprivileged numeric user.

ARG BASE_IMAGE=python:3.11.7-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY . .
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM ${BASE_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONSAFEPATH=1
COPY --from=build /wheels /tmp/wheels
# Install the wheel by its path (never by name from an index) with the operator extra.
# Not named "operator": Debian's base-passwd already has that group (gid 37), so groupadd would fail.
RUN set -eu; \
    wheel="$(ls /tmp/wheels/kube_rendezvous-*.whl)"; \
    pip install "${wheel}[operator]"; \
    rm -rf /tmp/wheels; \
    groupadd --system --gid 10001 kube-rendezvous; \
    useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin kube-rendezvous
# Numeric, so that runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
# Root-owned and read-only to the operator; PYTHONSAFEPATH keeps the working directory off sys.path.
WORKDIR /
# 8080: Kopf's liveness endpoint (/healthz); 9090: Prometheus /metrics.
EXPOSE 8080 9090
ENTRYPOINT ["python", "-m", "kube_rendezvous_operator"]
