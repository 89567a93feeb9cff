# Kelp image: multi-stage, non-root, CPU PyTorch by default.
#
#   docker build -t kelp:cpu .
#   docker build -t kelp:cuda --build-arg TORCH_VARIANT=cu126 .
#
# The CUDA variant installs PyTorch's CUDA wheels, which carry the CUDA runtime
# libraries; the node needs only the NVIDIA driver and container toolkit. To
# use a CUDA base image instead, also pass --build-arg PYTHON_IMAGE=<image with
# Python 3.11>. The entrypoint is `kelp`: `docker run kelp:cpu train --config ...`.
# The image holds no Kafka broker and no redis-server (those are test and demo
# tools); it talks to the cluster's Kafka and Redis. helm/kelp deploys it.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/kelp/bin:$PATH
WORKDIR /src
RUN python -m venv /opt/kelp \
    && pip install --no-cache-dir --index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}" "torch==${TORCH_VERSION}"
COPY pyproject.toml README.md ./
COPY kelp/ kelp/
COPY config/ config/
COPY consumers/ consumers/
COPY store/ store/
COPY trainer/ trainer/
COPY daemon/ daemon/
COPY cli/ cli/
COPY demo/ demo/
COPY examples/ examples/
COPY harness/ harness/
COPY bench/ bench/
COPY plots/ plots/
COPY publish/ publish/
COPY serving/ serving/
RUN pip install --no-cache-dir . \
    && kelp --version

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="kelp" \
      org.opencontainers.image.description="Streaming online learning for recommendation models" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 kelp \
    && useradd --system --uid 10001 --gid kelp --home-dir /var/lib/kelp --create-home --shell /usr/sbin/nologin kelp
COPY --from=build /opt/kelp /opt/kelp
COPY examples/ /etc/kelp/examples/
ENV PATH=/opt/kelp/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /var/lib/kelp
# 8080: kelp serve HTTP API; 9400: /metrics, /healthz and /readyz of kelp train.
EXPOSE 8080 9400
ENTRYPOINT ["kelp"]
CMD ["--help"]
