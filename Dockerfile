# kv-session-index. Build: install the project and its runtime dependencies (no test or
# lint tools) into a virtualenv; runtime: copy only that virtualenv onto a slim Python, run
# as a non-root user with `kvsi` as the entrypoint.
#   docker build -t kv-session-index .
#   docker run --rm -p 8000:8000 kv-session-index                       # demo fleet
#   docker run --rm kv-session-index serve --store redis://redis:6379/0 --pod ...
# The base, pinned by digest so that a rebuild of a release gets the same Python and Debian
# (refresh it deliberately: `docker buildx imagetools inspect python:3.11-slim-bookworm`).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

FROM ${PYTHON_IMAGE} AS build
# KVSI_REQUIRE_NATIVE: the image ships the compiled index core or fails to build (setup.py
# would otherwise fall back to the interpreted one).
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KVSI_REQUIRE_NATIVE=1
# A virtualenv without pip or setuptools: the build's own pip installs into it (--python),
# so neither reaches the runtime layer.
RUN python -m venv --without-pip /opt/kvsi
# A C compiler for the index core (setup.py: mypyc); the runtime layer needs none.
# DL3008: the compiler comes with the pinned base's Debian release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, pinned by constraints.txt, from pyproject.toml alone: a code edit
# reuses this layer instead of reinstalling every dependency. redis: the shared store;
# xxhash: vLLM's xxhash block hashing; k8s: central mode's discovery; otel: tracing.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; x = p['optional-dependencies']; print('\n'.join(p['dependencies'] + [d for e in ('redis', 'xxhash', 'k8s', 'otel') for d in x[e]]))" > requirements.txt \
    && pip --python /opt/kvsi/bin/python install -c constraints.txt -r requirements.txt
COPY README.md LICENSE setup.py ./
COPY kvsi kvsi
COPY subscriber subscriber
COPY store store
COPY api api
COPY simulator simulator
COPY hashing hashing
# Then the project alone; typer's rich (with pygments) only colours help and errors, which
# kvsi keeps plain: left out of the runtime layer with them. DL3013: the project from its
# own source; its dependencies are pinned above.
# hadolint ignore=DL3013
RUN pip --python /opt/kvsi/bin/python install --no-deps ".[redis,xxhash,k8s,otel]" \
    && pip --python /opt/kvsi/bin/python check \
    && pip --python /opt/kvsi/bin/python uninstall -y rich pygments markdown-it-py mdurl

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kv-session-index" \
      org.opencontainers.image.description="Per-session index of vLLM KV-cache blocks, served over REST" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin kvsi
COPY --from=build /opt/kvsi /opt/kvsi
ENV PATH=/opt/kvsi/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    KVSI_HOST=0.0.0.0 \
    KVSI_LOG_FORMAT=json
USER 10001:10001
EXPOSE 8000
# The API's port, or an ingest-only process's --metrics-port (KVSI_METRICS_PORT).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('KVSI_METRICS_PORT') or os.environ.get('KVSI_PORT') or '8000'; urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2)"]
ENTRYPOINT ["kvsi"]
CMD ["serve", "--demo"]
