# syntax=docker/dockerfile:1.7
# SpecRoute gateway image. Build:  docker build -t specroute:0.1.0 .
# With the source revision in specroute_build_info:  --build-arg GIT_REVISION="$(git rev-parse --short HEAD)"
# Stage 1 builds a wheel of the project (with its C extensions, the classifier's gram counter and the acceptance
# model's slots, so it has a compiler); stage 2 installs it with its serving dependencies only, at the versions
# pinned in constraints.txt, so no sources, build tools or extras reach the final image.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE constraints.txt ./
COPY gateway ./gateway
COPY classifiers ./classifiers
RUN python -m pip wheel --no-deps --wheel-dir /wheels . && cp constraints.txt /wheels/

FROM ${PYTHON_IMAGE} AS runtime
ARG UID=10001
ARG GIT_REVISION=unknown
# Extras to install beside the gateway, e.g. --build-arg EXTRAS=bench for the image the benchmark Job runs.
ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    HOME=/tmp \
    SPECROUTE_SERVER__HOST=0.0.0.0 \
    SPECROUTE_GIT_REVISION=${GIT_REVISION}
# The wheel and the constraints are bind-mounted from the build stage, so they never become a layer.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    wheel="$(ls /wheels/*.whl)" \
    && python -m pip install --no-cache-dir -c /wheels/constraints.txt "${wheel}${EXTRAS:+[${EXTRAS}]}" \
    && groupadd --system --gid "${UID}" specroute \
    && useradd --system --uid "${UID}" --gid "${UID}" --no-create-home --shell /usr/sbin/nologin specroute \
    && mkdir -p /etc/specroute
USER ${UID}:${UID}
EXPOSE 8000
# The health check reads the configuration the server reads (the same file, the same SPECROUTE_* variables), so it
# follows server.port and speaks https when server.tls_cert_file is set.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["specroute", "health", "--config", "/etc/specroute/config.yaml", "--timeout", "4"]
ENTRYPOINT ["specroute", "serve", "--config", "/etc/specroute/config.yaml"]
