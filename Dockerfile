# The llmgw image compose.yaml builds: the package installed once at build time, run as an
# unprivileged user. `docker build -t llmgw .`; then e.g. `docker run -p 8080:8080 llmgw`
# serves the bundled demo config.
FROM python:3.12-slim

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1

COPY pyproject.toml README.md /src/
COPY schemas /src/schemas
COPY bus /src/bus
COPY actors /src/actors
COPY gateway /src/gateway
RUN pip install /src[postgres] && rm -rf /src \
    && useradd --system --home-dir /data llmgw \
    && mkdir -p /data && chown llmgw /data && chmod 0700 /data

USER llmgw
WORKDIR /data
EXPOSE 8080
CMD ["llmgw", "serve", "--host", "0.0.0.0", "--port", "8080"]
