# kv-session-index. Build: install the project and its runtime dependencies (no test or
# lint tools) into a virtualenv; runtime: copy only that virtualenv onto a slim Python, run
# as a non-root user with `kvsi` as the entrypoint.
#   docker build -t kv-session-index .
#   docker run --rm -p 8000:8000 kv-session-index                       # demo fleet
#   docker run --rm kv-session-index serve --store redis://redis:6379/0 --pod ...
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/kvsi
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kvsi kvsi
COPY subscriber subscriber
COPY store store
COPY api api
COPY simulator simulator
COPY hashing hashing
# redis: the shared store; xxhash: vLLM's xxhash block hashing; k8s: central mode's discovery.
RUN /opt/kvsi/bin/pip install ".[redis,xxhash,k8s]"

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
