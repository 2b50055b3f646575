# syntax=docker/dockerfile:1.7
# sandbox-base: the image every sandbox pod runs (deploy/sandbox-base/sandbox-base.yaml).
# A general-purpose Linux userland (Debian bookworm with the packages of
# deploy/sandbox-base/packages.txt: python3, pip, git, curl, Node.js, sudo) with torpor's
# in-sandbox daemon (envd-compatible) as PID 1's child on :49983.
#
#   docker build -f deploy/docker/sandbox-base.Dockerfile -t torpor/sandbox-base:0.1.0 .
#
# Only services/envd is copied: the daemon imports nothing from the control plane (shared/),
# so no control-plane code or credentials ever land inside a sandbox.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
# The userland the sandbox runs on. scripts/build-images.sh passes the root filesystem of
# scripts/build-rootfs.sh here (already made from packages.txt + configure.sh: the step below
# is then skipped); on a public base that step installs it.
ARG RUNTIME_IMAGE=python:3.11.11-slim-bookworm

# ---- build: the daemon's own virtualenv (four pinned dependencies) --------------------------
# Checked on the host: the daemon with exactly these (and services/envd alone) serves /health,
# Start and List.
FROM ${PYTHON_IMAGE} AS build
# Behind a TLS-intercepting proxy, pip needs its CA: --build-arg PIP_CERT=<path mounted in the
# build> (scripts/build-images.sh mounts the host's bundle). Unset elsewhere; never in the image.
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/envd \
 && /opt/envd/bin/pip install "connectrpc==0.12.1" "protobuf-py==0.6.0" "uvicorn==0.54.0" "httptools==0.9.0"
COPY services/__init__.py /opt/envd/app/services/__init__.py
COPY services/envd /opt/envd/app/services/envd
RUN /opt/envd/bin/python -m compileall -q /opt/envd

# ---- runtime ---------------------------------------------------------------------------------
FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="torpor sandbox-base" \
      org.opencontainers.image.description="general-purpose sandbox userland + envd-compatible daemon on :49983" \
      org.opencontainers.image.licenses="Apache-2.0"
# The packages and user model of every sandbox, from ONE definition shared with the local
# runtime's rootfs (scripts/build-rootfs.sh): deploy/sandbox-base/packages.txt, then
# configure.sh (user `user` uid 1000 with passwordless sudo, /home/user, /workspace, torpor's
# sudo shim). tini reaps the zombies user processes leave behind.
COPY deploy/sandbox-base/packages.txt deploy/sandbox-base/configure.sh deploy/sandbox-base/sudo /tmp/sandbox-base/
RUN if [ -f /etc/torpor-rootfs ]; then \
      echo "sandbox-base: built on the rootfs of scripts/build-rootfs.sh ($(cat /etc/torpor-rootfs))"; \
    else \
      apt-get update \
      && sed -e 's/#.*//' /tmp/sandbox-base/packages.txt | xargs apt-get install -y --no-install-recommends \
      && sh /tmp/sandbox-base/configure.sh /tmp/sandbox-base/sudo; \
    fi \
 && rm -rf /tmp/sandbox-base /var/lib/apt/lists/*
COPY --from=build /opt/envd /opt/envd
ENV PYTHONPATH=/opt/envd/app \
    PYTHONUNBUFFERED=1 \
    LANG=C.UTF-8 \
    HOME=/home/user
# The user's own `python3`/`pip` stay the system ones; the daemon uses its private venv.
# The daemon runs as `user` here, so every request acts as `user` (switching to root per
# request, and the sudo shim's socket, need a daemon that is the sandbox's root: the local
# runtime's pods have that; the Kubernetes pod template does not yet).
USER 1000:1000
WORKDIR /home/user
EXPOSE 49983
HEALTHCHECK --interval=10s --timeout=2s CMD ["/opt/envd/bin/python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:49983/health', timeout=1)"]
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/envd/bin/python", "-m", "services.envd"]
CMD ["--listen", "0.0.0.0:49983", "--root", "/home/user"]
