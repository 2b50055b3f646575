# syntax=docker/dockerfile:1.7
# sandbox-base: the image every sandbox pod runs (deploy/sandbox-base/sandbox-base.yaml).
# A general-purpose Linux userland (Debian bookworm, bash, Python 3.11, git, curl, build tools
# kept small) with torpor's in-sandbox daemon (envd-compatible) as PID 1's child on :49983.
#
#   docker build -f deploy/docker/sandbox-base.Dockerfile -t torpor/sandbox-base:0.1.0 .
#
# Only services/envd is copied: the daemon imports nothing from the control plane (shared/),
# so no control-plane code or credentials ever land inside a sandbox.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- build: the daemon's own virtualenv (four pinned dependencies) --------------------------
# Checked on the host: the daemon with exactly these (and services/envd alone) serves /health,
# Start and List.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/envd \
 && /opt/envd/bin/pip install "connectrpc==0.12.1" "protobuf-py==0.6.0" "uvicorn==0.54.0" "httptools==0.9.0"
COPY services/__init__.py /opt/envd/app/services/__init__.py
COPY services/envd /opt/envd/app/services/envd
RUN /opt/envd/bin/python -m compileall -q /opt/envd

# ---- runtime ---------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="torpor sandbox-base" \
      org.opencontainers.image.description="general-purpose sandbox userland + envd-compatible daemon on :49983" \
      org.opencontainers.image.licenses="Apache-2.0"
# tini reaps the zombies user processes leave behind; the rest is what agents expect to find.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      bash ca-certificates coreutils curl git less procps tini unzip xz-utils \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 1000 --create-home --home-dir /home/user --shell /bin/bash user \
 && mkdir -p /workspace && chown user:user /workspace
COPY --from=build /opt/envd /opt/envd
ENV PYTHONPATH=/opt/envd/app \
    PYTHONUNBUFFERED=1 \
    LANG=C.UTF-8 \
    HOME=/workspace
# The user's own `python3`/`pip` stay the system ones; the daemon uses its private venv.
USER 1000:1000
WORKDIR /workspace
EXPOSE 49983
HEALTHCHECK --interval=10s --timeout=2s CMD ["/opt/envd/bin/python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:49983/health', timeout=1)"]
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/envd/bin/python", "-m", "services.envd"]
CMD ["--listen", "0.0.0.0:49983", "--root", "/workspace"]
