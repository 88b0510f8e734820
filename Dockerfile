# vllm-prefix-cache-exporter: the sidecar image.
# Build: docker build -t vllm-prefix-cache-exporter:0.1.0 .
# Runs as a non-root user with a read-only root filesystem; writes nothing to disk.
#
# The base is pinned by the digest of its multi-platform index (linux/amd64 and
# linux/arm64 among its platforms), as docker-library/repo-info recorded it for
# python:3.11.16-slim-bookworm (build of 2026-09-01). CI (.github/workflows/image.yml)
# checks that the digest resolves with both platforms and warns when the
# python:3.11-slim-bookworm tag has moved on, which is when to bump it here.
ARG PYTHON_IMAGE=python:3.11.16-slim-bookworm@sha256:c425d915a89a6dcd3183b1797ad9bd8878caff5a417f6371c8df93c8ea8b727f

FROM ${PYTHON_IMAGE} AS build
# everything pip fetches comes from hash-locked pins: the build backend (setuptools) into
# a throwaway venv, the runtime dependencies into the image's venv. This layer is rebuilt
# only when a lock changes.
COPY requirements.lock requirements-build.lock /tmp/
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --no-cache-dir --require-hashes --no-deps -r /tmp/requirements-build.lock \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --require-hashes --no-deps -r /tmp/requirements.lock
# then the code, built with the locked backend (no build isolation, so nothing unpinned
# is downloaded) and installed without dependency resolution: the lock is the whole set
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY exporter ./exporter
RUN /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /tmp/dist . \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps /tmp/dist/*.whl

FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
LABEL org.opencontainers.image.title="vllm-prefix-cache-exporter" \
      org.opencontainers.image.description="Prometheus exporter and alerting sidecar for vLLM prefix caching" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 9464
# asks /-/healthy where the sidecar (PID 1) listens, with TLS where its web config has it:
# its --web.listen-address, web.listen_address and --web.config.file, not a fixed :9464
HEALTHCHECK --interval=30s --timeout=3s --start-period=10s --retries=3 \
    CMD ["vllm-prefix-cache-exporter", "healthcheck"]
ENTRYPOINT ["vllm-prefix-cache-exporter"]
CMD ["run", "--config.file=/etc/vllm-prefix-cache-exporter/config.yml"]
