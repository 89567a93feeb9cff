#!/usr/bin/env bash
# `make image`: builds Kelp's image with docker when its daemon answers, else
# podman or buildah (scripts/image/engine.sh), reusing the layer cache.
#
# Environment (all optional):
#   KELP_IMAGE       tag to build (kelp:cpu)
#   PYTHON_IMAGE     base image; default python:3.11.11-slim-bookworm with docker,
#                    and with podman/buildah the local debootstrap base
#                    localhost/kelp-base:bookworm, made by build-base.sh when missing
#                    (these machines cannot pull from a registry)
#   TORCH_VERSION    2.13.0;  TORCH_VARIANT  cpu (or cu126, ...)
#   TORCH_INDEX_URL  where torch comes from when no local wheel is staged
#   TORCH_WHEELS     folder in the repository with a torch wheel to use; by
#                    default the machine's local torch file is staged in
#                    scripts/image/wheels (found with `pip download --no-index`,
#                    so pip's own find-links configuration decides)
#   PIP_CERT         CA bundle pip inside the build trusts (default: SSL_CERT_FILE,
#                    else /etc/ssl/certs/ca-certificates.crt); passed as a build
#                    secret, so it never lands in a layer
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=scripts/image/engine.sh
source "$here/engine.sh"

image="${KELP_IMAGE:-kelp:cpu}"
torch_version="${TORCH_VERSION:-2.13.0}"
torch_variant="${TORCH_VARIANT:-cpu}"
local_base="localhost/kelp-base:bookworm"

image_exists() {
  case "$kelp_engine" in
    docker) docker image inspect "$1" >/dev/null 2>&1 ;;
    podman) podman "${KELP_ENGINE_FLAGS[@]}" image exists "$1" ;;
    buildah) buildah inspect --type image "$1" >/dev/null 2>&1 ;;
  esac
}

base="${PYTHON_IMAGE:-}"
if [ -z "$base" ]; then
  if [ "$kelp_engine" = docker ]; then
    base="python:3.11.11-slim-bookworm"
  else
    base="$local_base"
  fi
fi
if [ "$base" = "$local_base" ] && ! image_exists "$base"; then
  echo "kelp: base image $base not found locally; making it with debootstrap" >&2
  bash "$here/build-base.sh" "$base"
fi

build_args=(
  --build-arg "PYTHON_IMAGE=$base"
  --build-arg "TORCH_VERSION=$torch_version"
  --build-arg "TORCH_VARIANT=$torch_variant"
)
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  build_args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
fi
if [ -n "${TORCH_WHEELS:-}" ]; then
  build_args+=(--build-arg "TORCH_WHEELS=$TORCH_WHEELS")
else
  # The machine's own torch file, when pip knows one (find-links), instead of
  # a download of several hundred MB from the index.
  wheels="$root/scripts/image/wheels"
  if ! compgen -G "$wheels/torch-$torch_version+$torch_variant-*.whl" >/dev/null; then
    "${PYTHON:-python3}" -m pip download --quiet --no-index --no-deps \
      "torch==$torch_version+$torch_variant" -d "$wheels" >/dev/null 2>&1 ||
      echo "kelp: no local torch $torch_version+$torch_variant wheel; the build installs it from TORCH_INDEX_URL" >&2
  fi
fi

cert="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
secret=()
if [ -f "$cert" ]; then
  secret=(--secret "id=pip_cert,src=$cert")
fi

echo "kelp: building $image with $kelp_engine (base $base, torch $torch_version+$torch_variant)" >&2
cd "$root"
case "$kelp_engine" in
  docker) DOCKER_BUILDKIT=1 docker build "${build_args[@]}" "${secret[@]}" -t "$image" -f Dockerfile . ;;
  podman | buildah)
    "$kelp_engine" "${KELP_ENGINE_FLAGS[@]}" build "${KELP_BUILD_FLAGS[@]}" \
      "${build_args[@]}" "${secret[@]}" -t "$image" -f Dockerfile .
    ;;
esac
echo "kelp: built $image" >&2
