# enginecache: the dashboard plus one CPU worker (TensorRT-RTX builds on the CPU; ONNX Runtime
# CPU engines) on an SQLite catalog in the `engines/` volume.
#
#   docker build -t enginecache .
#   docker run -p 8501:8501 -v enginecache-engines:/app/engines enginecache
#
# A GPU worker that loads engines (and builds with full TensorRT) is Dockerfile.gpu; point it at
# the same catalog (ENGINECACHE_DB_URL=postgresql://...) and store.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ENGINECACHE_HOME=/app/engines

WORKDIR /app

# Dependencies first (cached while only the code changes), then the code.
COPY pyproject.toml README.md ./
COPY enginecache ./enginecache
RUN pip install --no-cache-dir . \
    && groupadd --system --gid 10001 enginecache \
    && useradd --system --uid 10001 --gid enginecache --home-dir /app --no-create-home enginecache \
    && mkdir -p /app/engines \
    && chown enginecache:enginecache /app/engines

USER 10001:10001
VOLUME ["/app/engines"]
EXPOSE 8501

HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4).read() == b'ok' else 1)"]

ENTRYPOINT ["enginecache"]
# Safe by default: with no login configured the dashboard listens on 127.0.0.1 inside the container.
# To serve others, mount a .streamlit/secrets.toml with an [auth] (OIDC) section and add
# `--address 0.0.0.0`, or run behind an authenticating proxy with `--address 0.0.0.0 --insecure-no-auth`.
CMD ["serve", "--port", "8501"]
