#!/usr/bin/env bash
# Installs the system packages Kelp's tests and demo need, only when missing:
# redis-server and redis-cli (Debian packages `redis-server`, `redis-tools`) and
# promtool (Debian package `prometheus`; the deploy tests check the alert rules
# and the dashboard's PromQL with it).
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "kelp: ${missing[*]} missing and apt-get is not available; install Redis 7 (redis-server, redis-cli) and promtool (Prometheus) yourself" >&2
  exit 1
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
echo "kelp: installing ${missing[*]} with apt-get" >&2
"${sudo_cmd[@]}" apt-get update -qq
# The `prometheus` package also ships the server (its service may be enabled);
# Kelp only uses promtool from it.
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
