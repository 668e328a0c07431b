# kv-session-index: build a wheel, install it alone into a slim runtime image.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kvsi kvsi
COPY subscriber subscriber
COPY store store
COPY api api
COPY simulator simulator
COPY hashing hashing
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[redis,xxhash]"

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 kvsi
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER kvsi
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)" || exit 1
ENTRYPOINT ["kvsi"]
CMD ["serve", "--host", "0.0.0.0", "--demo"]
