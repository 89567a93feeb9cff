#!/usr/bin/env bash
# Makes a local Python 3.11 base image (Debian bookworm, minbase) for machines
# that cannot pull python:3.11-slim from a registry: debootstrap a rootfs with
# Debian's python3 (3.11) and venv, trim what no container needs (apt lists,
# docs, man pages, translations), and import it with the container engine.
#
#   bash scripts/image/build-base.sh [IMAGE]   # default localhost/kelp-base:bookworm
#
# Needs root and debootstrap (apt-get install debootstrap). DEBIAN_MIRROR picks
# the mirror. The image has `python` and `python3` on PATH, like the official
# Python images, so the Dockerfile's stages work on either.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/image/engine.sh
source "$here/engine.sh"

image="${1:-localhost/kelp-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

[ "$(id -u)" -eq 0 ] || kelp_fail "build-base.sh runs debootstrap, which needs root"
command -v debootstrap >/dev/null 2>&1 || kelp_fail "debootstrap not found (Debian: apt-get install debootstrap)"
[ -n "$kelp_run_engine" ] || kelp_fail "importing a base image needs docker or podman, not buildah alone"

work="$(mktemp -d "${TMPDIR:-/var/tmp}/kelp-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"

echo "kelp: debootstrap bookworm (minbase + python3, python3-venv) into $rootfs" >&2
debootstrap --variant=minbase \
  --include=python3,python3-venv,python-is-python3,ca-certificates \
  bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -20 "$work/debootstrap.log" >&2
  kelp_fail "debootstrap failed (log above)"
}

# Nothing in a container reads these; apt-get update brings the lists back.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/log/* \
  "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
  "$rootfs"/usr/share/locale/* "$rootfs"/tmp/* "$rootfs"/var/tmp/*
# The build host's resolver settings must not leak into the image.
: >"$rootfs/etc/resolv.conf"
: >"$rootfs/etc/hostname"

echo "kelp: importing $(du -sh "$rootfs" | cut -f1) rootfs as $image" >&2
tar --numeric-owner -C "$rootfs" -c . |
  "$kelp_run_engine" "${KELP_ENGINE_FLAGS[@]}" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$image" >"$work/import.log" 2>&1 || {
  cat "$work/import.log" >&2
  kelp_fail "importing the rootfs failed (log above)"
}
# An empty tar stream imports "successfully" as an empty image; refuse that.
"$kelp_run_engine" "${KELP_ENGINE_FLAGS[@]}" run "${KELP_RUN_FLAGS[@]}" --rm "$image" python3 -c 'import venv, ensurepip' ||
  kelp_fail "$image has no working python3 with venv"
echo "kelp: base image $image ready" >&2
