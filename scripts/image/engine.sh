#!/usr/bin/env bash
# shellcheck disable=SC2034  # the variables are for the scripts that source this file
# Picks the container engine for `make image` and `make image-test`, and the
# flags it needs, so every script under scripts/image agrees.
#
# Sourced: defines kelp_engine (docker, podman or buildah), kelp_run_engine
# (what runs containers: docker or podman, empty with buildah alone) and the
# arrays KELP_ENGINE_FLAGS (global flags, right after the engine's name),
# KELP_BUILD_FLAGS (for its build command) and KELP_RUN_FLAGS (for its run
# command). Executed: prints the chosen engine.
#
# docker counts only when its daemon answers (`docker info`): a docker client
# without an engine, as on machines that have only the CLI, would fail the
# build. KELP_IMAGE_ENGINE=docker|podman|buildah overrides the choice.
# Podman runs rootful here without systemd, so it is told to use runc and
# cgroupfs and to build with chroot isolation. Its default ulimits (nofile and
# nproc of about a million) are above what an unprivileged sandbox may set, so
# runc fails with "error setting rlimit"; containers get nofile at the caller's
# hard limit and nproc=4096 instead. KELP_PODMAN_FLAGS, KELP_PODMAN_RUN_FLAGS
# and KELP_BUILD_ISOLATION override these defaults.

kelp_fail() {
  echo "kelp: error: $*" >&2
  exit 2
}

kelp_pick_engine() {
  if [ -n "${KELP_IMAGE_ENGINE:-}" ]; then
    case "$KELP_IMAGE_ENGINE" in
      docker | podman | buildah) ;;
      *) kelp_fail "KELP_IMAGE_ENGINE must be docker, podman or buildah, not '$KELP_IMAGE_ENGINE'" ;;
    esac
    command -v "$KELP_IMAGE_ENGINE" >/dev/null 2>&1 || kelp_fail "KELP_IMAGE_ENGINE=$KELP_IMAGE_ENGINE but it is not on PATH"
    echo "$KELP_IMAGE_ENGINE"
    return
  fi
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    echo docker
  elif command -v podman >/dev/null 2>&1; then
    echo podman
  elif command -v buildah >/dev/null 2>&1; then
    echo buildah
  else
    kelp_fail "no usable container engine: install docker (with a running daemon), or podman/buildah (Debian: apt-get install podman buildah)"
  fi
}

kelp_engine="$(kelp_pick_engine)" || exit $?
kelp_run_engine=""
KELP_BUILD_FLAGS=()
KELP_ENGINE_FLAGS=()
KELP_RUN_FLAGS=()
case "$kelp_engine" in
  docker)
    kelp_run_engine=docker
    ;;
  podman)
    kelp_run_engine=podman
    read -r -a KELP_ENGINE_FLAGS <<<"${KELP_PODMAN_FLAGS:---runtime runc --cgroup-manager cgroupfs}"
    KELP_BUILD_FLAGS=(--isolation "${KELP_BUILD_ISOLATION:-chroot}")
    nofile="$(ulimit -Hn)"
    if [ "$nofile" = unlimited ] || [ "$nofile" -gt 65536 ]; then
      nofile=65536
    fi
    read -r -a KELP_RUN_FLAGS <<<"${KELP_PODMAN_RUN_FLAGS:---ulimit nofile=$nofile:$nofile --ulimit nproc=4096:4096}"
    ;;
  buildah)
    # buildah, unlike podman, keeps no layer cache unless asked.
    KELP_BUILD_FLAGS=(--layers --isolation "${KELP_BUILD_ISOLATION:-chroot}")
    ;;
esac

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "$kelp_engine"
fi
