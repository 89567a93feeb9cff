# Kelp image: multi-stage, non-root, CPU PyTorch by default.
#
#   make image                      # picks docker, else podman/buildah (scripts/image/build.sh)
#   docker build -t kelp:cpu .
#   docker build -t kelp:cuda --build-arg TORCH_VARIANT=cu126 .
#
# Build arguments:
#   PYTHON_IMAGE     base of both stages: any Debian-based image with Python 3.11,
#                    `python` on PATH and venv (the official python:3.11-slim, or
#                    the local debootstrap base that scripts/image/build-base.sh makes)
#   TORCH_VERSION    the torch release to install (2.13.0)
#   TORCH_VARIANT    cpu, or a CUDA variant such as cu126 (picks TORCH_INDEX_URL's default)
#   TORCH_INDEX_URL  where torch comes from when no local wheel is given
#   TORCH_WHEELS     a folder in the build context; a torch-${TORCH_VERSION}+${TORCH_VARIANT}
#                    wheel there is installed instead of the index (build.sh puts
#                    the machine's local torch file there)
# pip reaches PyPI for the other dependencies; a CA bundle for a TLS-inspecting
# proxy is passed as the build secret `pip_cert` (never stored in a layer).
#
# The CUDA variant installs PyTorch's CUDA wheels, which carry the CUDA runtime
# libraries; the node needs only the NVIDIA driver and container toolkit. The
# entrypoint is `kelp`: `docker run kelp:cpu train --config ...`. The image
# holds no Kafka broker and no redis-server (those are test and demo tools); it
# talks to the cluster's Kafka and Redis, and `kelp demo` in it runs the
# embedded path (file source, in-memory store). helm/kelp deploys it.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS deps
ARG TORCH_VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/${TORCH_VARIANT}
ARG TORCH_WHEELS=scripts/image/wheels
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/kelp/bin:$PATH
WORKDIR /src

# torch first, in its own layer: it is most of the image and changes least.
# What the runtime never loads goes in the same step: torch's C++ headers,
# CMake files, C++ test binaries and test libraries (about 200 MB), and the
# symbol tables of its two big libraries (about 90 MB; `strip --strip-unneeded`
# keeps the dynamic symbols that loading needs). binutils stays in this stage.
COPY ${TORCH_WHEELS}/ /wheels/
# DL3013: "$wheel" is a file whose name pins torch-${TORCH_VERSION}+${TORCH_VARIANT}.
# DL3008: binutils is used once here and never reaches the runtime stage.
# hadolint ignore=DL3008,DL3013
RUN apt-get update \
    && apt-get install -y --no-install-recommends binutils \
    && rm -rf /var/lib/apt/lists/* \
    && python -m venv /opt/kelp \
    && wheel="$(find /wheels -maxdepth 1 -name "torch-${TORCH_VERSION}+${TORCH_VARIANT}-*.whl" -print -quit)" \
    && if [ -n "$wheel" ]; then \
         pip install --no-cache-dir --no-index --no-deps "$wheel"; \
       else \
         pip install --no-cache-dir --no-deps --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"; \
       fi \
    && rm -rf /wheels \
    && torch="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch" \
    && rm -rf "$torch/include" "$torch/share" "$torch/test" \
    && find "$torch/bin" -mindepth 1 ! -name torch_shm_manager -exec rm -rf {} + \
    && rm -f "$torch"/lib/libaoti_custom_ops.so "$torch"/lib/libbackend_with_compiler.so \
             "$torch"/lib/libjitbackend_test.so "$torch"/lib/libtorchbind_test.so \
    && strip --strip-unneeded "$torch/lib/libtorch_cpu.so" "$torch/lib/libtorch_python.so"

# Kelp's and torch's dependencies from PyPI, keyed on pyproject.toml only, so
# a change to Kelp's code does not download them again. The `grpc` extra is in
# too, so serving.grpc_port works in the image. pip then leaves the venv: the
# runtime installs nothing. (setuptools stays: torch requires it.)
COPY pyproject.toml ./
RUN --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['grpc']))" >/tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt "torch==${TORCH_VERSION}" \
    && pip uninstall --yes --quiet pip

# kelp_native (native/: Rust, PyO3) is built here from source with Debian's own
# cargo, before Kelp's code so that a change to Kelp's code does not rebuild it;
# the runtime stage gets the built extension, never the toolchain. cargo reaches
# crates.io for the crates Cargo.lock pins (the CA bundle secret serves it too).
FROM deps AS build
# DL3008: cargo is used once here and never reaches the runtime stage.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends cargo \
    && rm -rf /var/lib/apt/lists/*
COPY native/ native/
RUN --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert CARGO_HTTP_CAINFO=/run/secrets/pip_cert; fi \
    && python -m venv /opt/pip \
    && /opt/pip/bin/pip --python /opt/kelp/bin/python install --no-cache-dir ./native \
    && rm -rf native/target
# Kelp itself, installed into the venv by a throwaway pip (`pip --python`), and
# its files and kelp_native's (the RECORDs' lists, read with -I so that /src's
# kelp.egg-info is not the one found) gathered under /app. The runtime stage copies
# the dependency venv and /app as two layers, so a change to Kelp's code ships
# as a layer of a few MB instead of the whole venv again.
COPY README.md ./
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
COPY join/ join/
COPY bench/ bench/
COPY plots/ plots/
COPY publish/ publish/
COPY serving/ serving/
RUN --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && /opt/pip/bin/pip --python /opt/kelp/bin/python install --no-cache-dir --no-deps . \
    && /opt/pip/bin/pip --python /opt/kelp/bin/python check \
    && kelp --version \
    && python -I -c "import kelp.store.redis._wire.row_replies" \
    && python -I -c "import importlib.metadata as m, os; print('\n'.join(os.path.normpath(f.locate()).lstrip('/') for d in ('kelp', 'kelp-native') for f in m.distribution(d).files))" >/tmp/kelp-files \
    && grep -qx opt/kelp/bin/kelp /tmp/kelp-files \
    && tar -C / -cf /tmp/kelp.tar -T /tmp/kelp-files \
    && mkdir /app \
    && tar -C /app -xf /tmp/kelp.tar

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="kelp" \
      org.opencontainers.image.description="Streaming online learning for recommendation models" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 kelp \
    && useradd --system --uid 10001 --gid kelp --home-dir /var/lib/kelp --create-home --shell /usr/sbin/nologin kelp
COPY --from=deps /opt/kelp /opt/kelp
COPY --from=build /app/ /
COPY examples/ /etc/kelp/examples/
ENV PATH=/opt/kelp/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /var/lib/kelp
# 8080: kelp serve HTTP API; 9400: /metrics, /healthz and /readyz of kelp train;
# 9410: the same of kelp join.
EXPOSE 8080 9400 9410
ENTRYPOINT ["kelp"]
CMD ["--help"]
