#!/usr/bin/env bash
# Installs the system packages Kelp's tests and demo need, only when missing:
# redis-server and redis-cli (Debian package `redis-server`).
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "kelp: ${missing[*]} missing and apt-get is not available; install Redis 7 (redis-server, redis-cli) yourself" >&2
  exit 1
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
echo "kelp: installing ${missing[*]} with apt-get" >&2
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends redis-server redis-tools
