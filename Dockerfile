# Dashboard + CPU worker image (the dashboard issue completes it).
FROM python:3.11-slim
RUN useradd --create-home --uid 1000 enginecache
WORKDIR /app
COPY pyproject.toml README.md ./
COPY core core
COPY db db
COPY service service
COPY dashboard dashboard
RUN pip install --no-cache-dir .
USER enginecache
ENV ENGINECACHE_HOME=/data
VOLUME ["/data"]
ENTRYPOINT ["enginecache"]
CMD ["--help"]
