#!/usr/bin/env bash
# Installs the system packages Kelp needs, only when missing.
#
#   scripts/install-system-deps.sh                    redis-server and redis-cli (Debian packages
#                                                     `redis-server`, `redis-tools`): what the demo and
#                                                     every Redis-backed run need (`make demo`, `make setup`);
#                                                     and cargo (Debian package `cargo`), which builds the
#                                                     native extension kelp_native from native/ (`make setup`)
#   scripts/install-system-deps.sh --with-test-tools  also promtool (Debian package `prometheus`): a
#                                                     test-only tool, the deploy tests check the alert
#                                                     rules and the dashboard's PromQL with it (`make test`);
#                                                     and, best effort, Java 17 and Maven (`openjdk-17-jre-headless`,
#                                                     `maven`) for the Apache Kafka test broker: where they
#                                                     cannot be installed the tests fall back to Tansu
#   ... --dry-run                                     print what would be installed, install nothing
set -euo pipefail

with_test_tools=0
dry_run=0
for arg in "$@"; do
  case "$arg" in
    --with-test-tools) with_test_tools=1 ;;
    --dry-run) dry_run=1 ;;
    *) echo "kelp: install-system-deps.sh: unknown argument $arg (expected --with-test-tools, --dry-run)" >&2; exit 2 ;;
  esac
done

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
if [ "$with_test_tools" -eq 1 ]; then
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
  command -v nft >/dev/null 2>&1 || missing+=(nftables)  # the host rig's packet loss where the kernel has no netem
fi

# The Kafka test broker's needs: wanted, not required (the tests fall back to Tansu without them).
optional=()
if [ "$with_test_tools" -eq 1 ]; then
  command -v java >/dev/null 2>&1 || optional+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null 2>&1 || optional+=(maven)
fi

# apt_install WHY PACKAGE...: one apt-get install for these packages; its status is apt-get's.
apt_install() {
  local why="$1"
  shift
  local sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  echo "kelp: installing $* with apt-get${why:+ ($why)}" >&2
  "${sudo_cmd[@]}" apt-get update -qq || return 1
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# The Kafka test broker's needs first: wanted, not required, so nothing here stops the script.
if [ ${#optional[@]} -gt 0 ]; then
  if [ "$dry_run" -eq 1 ]; then
    echo "kelp: would install ${optional[*]} with apt-get (optional: the Apache Kafka test broker)" >&2
  elif ! command -v apt-get >/dev/null 2>&1; then
    echo "kelp: ${optional[*]} missing and apt-get is not available; the Kafka tests will run on Tansu" >&2
  elif ! apt_install "the Apache Kafka test broker" "${optional[@]}"; then
    echo "kelp: could not install ${optional[*]}; the Kafka tests will run on Tansu" >&2
  fi
fi

# Rust's cargo builds kelp_native (native/) from source: required, and installed on its own so its
# reason is said. Debian 12's own cargo is new enough (native/Cargo.toml's rust-version).
if ! command -v cargo >/dev/null 2>&1; then
  why="Rust's cargo: it builds the native extension kelp_native from native/"
  if [ "$dry_run" -eq 1 ]; then
    echo "kelp: would install cargo with apt-get ($why)" >&2
  elif ! command -v apt-get >/dev/null 2>&1; then
    echo "kelp: cargo missing and apt-get is not available; install Rust's cargo (rustc >= 1.63) yourself ($why)" >&2
    exit 1
  else
    apt_install "$why" cargo
  fi
fi

if [ ${#missing[@]} -eq 0 ]; then
  [ "$dry_run" -eq 1 ] && command -v cargo >/dev/null 2>&1 && echo "kelp: nothing to install" >&2
  exit 0
fi

if [ "$dry_run" -eq 1 ]; then
  echo "kelp: would install ${missing[*]} with apt-get" >&2
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "kelp: ${missing[*]} missing and apt-get is not available; install Redis 7 (redis-server, redis-cli) yourself, and promtool (Prometheus) for the tests" >&2
  exit 1
fi

# The `prometheus` package also ships the server (its service may be enabled);
# Kelp only uses promtool from it, and only in tests.
apt_install "" "${missing[@]}"
