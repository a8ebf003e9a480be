# enginecache: the dashboard plus one CPU worker (TensorRT-RTX builds on the CPU; ONNX Runtime
# CPU engines) on an SQLite catalog in the `engines/` volume.
#
#   docker build -t enginecache .
#   docker run -p 8501:8501 -v enginecache-engines:/app/engines \
#       -v "$PWD/secrets.toml:/app/.streamlit/secrets.toml:ro" enginecache    # a login ([auth], OIDC)
#   docker run -p 8501:8501 -v enginecache-engines:/app/engines \
#       -e ENGINECACHE_ADDRESS=0.0.0.0 -e ENGINECACHE_INSECURE_NO_AUTH=1 enginecache  # behind an authenticating proxy
#
# With neither, the dashboard listens on 127.0.0.1 inside the container (the published port answers
# nothing) and says so. tests/test_image.py builds and runs this file from a locally made Debian base.
#
# A GPU worker that loads engines (and builds with full TensorRT) is Dockerfile.gpu; point it at
# the same catalog (ENGINECACHE_DB_URL=postgresql://...) and store.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ENGINECACHE_HOME=/app/engines \
    ENGINECACHE_LOGIN_ADDRESS=0.0.0.0

WORKDIR /app

# Dependencies first, as pyproject.toml lists them (this layer is cached while only the code
# changes), then the package itself.
COPY pyproject.toml ./
RUN python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep=chr(10))" \
        > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY README.md ./
COPY enginecache ./enginecache
RUN pip install --no-cache-dir --no-deps . \
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
# A mounted /app/.streamlit/secrets.toml with an [auth] (OIDC) provider makes it listen on 0.0.0.0
# (ENGINECACHE_LOGIN_ADDRESS); behind an authenticating proxy, ENGINECACHE_ADDRESS=0.0.0.0 and
# ENGINECACHE_INSECURE_NO_AUTH=1 open it with no login (warned about at every start).
CMD ["serve", "--port", "8501"]
