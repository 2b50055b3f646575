# syntax=docker/dockerfile:1.7
# torpor's control plane: ONE image for api, proxy, scheduler, snapshotter and scaler.
# The service is chosen by the command:  torpor run <service>   (see deploy/kustomize).
#
#   docker build -f deploy/docker/control-plane.Dockerfile -t torpor/control-plane:0.1.0 .
#
# Bases are pinned by exact tag; pin by digest in your registry mirror for reproducible builds
# (docker buildx imagetools inspect python:3.11.11-slim-bookworm).
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- build: resolve and install the package into a self-contained virtualenv ----------------
FROM ${PYTHON_IMAGE} AS build
# Behind a TLS-intercepting proxy, pip needs its CA: --build-arg PIP_CERT=<path mounted in the
# build> (scripts/build-images.sh mounts the host's bundle). Unset elsewhere; never in the image.
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/torpor
# Dependencies first (cached while only the code changes): install from pyproject metadata.
COPY pyproject.toml README.md /src/
RUN mkdir -p /src/shared /src/services && touch /src/shared/__init__.py /src/services/__init__.py \
 && /opt/torpor/bin/pip install /src \
 && /opt/torpor/bin/pip uninstall -y torpor
COPY shared /src/shared
COPY services /src/services
RUN /opt/torpor/bin/pip install --no-deps /src \
 && /opt/torpor/bin/python -m compileall -q /opt/torpor/lib \
 # tests and benchmarks never ship; the embedded nats-server binary is only for `torpor up`
 && rm -f /opt/torpor/bin/nats-server

# ---- runtime: the same base, no compiler, no pip cache, a non-root user ---------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="torpor control plane" \
      org.opencontainers.image.description="api, proxy, scheduler, snapshotter, scaler (torpor run <service>)" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 torpor \
 && useradd --system --uid 10001 --gid torpor --home-dir /nonexistent --shell /usr/sbin/nologin torpor
COPY --from=build /opt/torpor /opt/torpor
ENV PATH=/opt/torpor/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TORPOR_LOG_FORMAT=json \
    TORPOR_RUNTIME=kubernetes
USER 10001:10001
# api 3000, proxy 3001, workers' /livez /readyz /metrics 8080
EXPOSE 3000 3001 8080
ENTRYPOINT ["torpor"]
CMD ["run", "api"]
