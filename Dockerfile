# vllm-prefix-cache-exporter: the sidecar image.
# Build: docker build -t vllm-prefix-cache-exporter:0.1.0 .
# Runs as a non-root user with a read-only root filesystem; writes nothing to disk.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --upgrade "pip>=24" \
    && /opt/venv/bin/pip wheel --no-cache-dir --wheel-dir /wheels . \
    && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels vllm-prefix-cache-exporter

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="vllm-prefix-cache-exporter" \
      org.opencontainers.image.description="Prometheus exporter and alerting sidecar for vLLM prefix caching" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 9464
HEALTHCHECK --interval=30s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/-/healthy', timeout=2)"]
ENTRYPOINT ["vllm-prefix-cache-exporter"]
CMD ["run", "--config.file=/etc/vllm-prefix-cache-exporter/config.yml"]
