#!/usr/bin/env bash
# `make image-test`: builds Kelp's image (layer cache makes a rebuild cheap)
# and checks it the way an operator runs it: non-root, read-only root
# filesystem with a tmpfs on /tmp, no network needed. Inside the image it runs
# `kelp --version`, `kelp config validate` on every shipped example and
# `kelp demo`. The image carries no redis-server and no Kafka broker, so the
# demo takes its embedded path (file source, in-memory store, the same trainer
# daemon); the test requires that path to finish and to report an AUC.
# Prints the image's size and its largest layers. Exits 1 on the first failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=scripts/image/engine.sh
source "$here/engine.sh"

image="${KELP_IMAGE:-kelp:cpu}"
[ -n "$kelp_run_engine" ] || kelp_fail "image-test runs containers: it needs docker or podman, not buildah alone"

if [ "${KELP_IMAGE_TEST_NO_BUILD:-0}" != 1 ]; then
  bash "$here/build.sh"
fi

engine() { "$kelp_run_engine" "${KELP_ENGINE_FLAGS[@]}" "$@"; }
# How an operator (and helm/kelp) runs it: read-only root, writable /tmp only.
run_ro() { engine run "${KELP_RUN_FLAGS[@]}" --rm --read-only --tmpfs /tmp:rw,size=512m --network none "$@"; }
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
step() { printf '\n== %s\n' "$*"; }

step "kelp --version"
run_ro "$image" --version || fail "kelp --version"

step "runs as non-root"
user="$(engine image inspect --format '{{.Config.User}}' "$image")"
[ "$user" = "10001:10001" ] || fail "image USER is '$user', expected 10001:10001"
ids="$(run_ro --entrypoint id "$image")"
echo "$ids"
case "$ids" in
  "uid=10001(kelp) gid=10001(kelp)"*) ;;
  *) fail "the container does not run as kelp (10001)" ;;
esac

step "read-only root filesystem (only /tmp is writable)"
run_ro -i --entrypoint python "$image" - <<'PY' || fail "read-only check"
import errno, os, tempfile
for path in ("/opt/kelp/probe", "/var/lib/kelp/probe", "/etc/kelp/probe"):
    try:
        open(path, "w").close()
    except OSError as exc:
        assert exc.errno in (errno.EROFS, errno.EACCES), (path, exc)
        print(f"write to {path}: refused ({errno.errorcode[exc.errno]})")
    else:
        raise SystemExit(f"{path} is writable")
with tempfile.NamedTemporaryFile(dir="/tmp") as f:
    print(f"write to {f.name}: ok (tmpfs)")
PY

step "runtime stage carries no compiler, pip or caches"
# shellcheck disable=SC2016  # the script runs inside the container
# (The official python images carry their own pip in /usr/local/bin: only the
# venv's is checked.)
run_ro --entrypoint sh "$image" -c '
  for tool in gcc cc g++ make; do
    if command -v "$tool" >/dev/null 2>&1; then echo "found $tool: $(command -v "$tool")"; exit 1; fi
  done
  for path in /opt/kelp/bin/pip /opt/kelp/bin/pip3 /root/.cache /var/lib/kelp/.cache \
    /opt/kelp/lib/python3.11/site-packages/torch/include; do
    if [ -e "$path" ]; then echo "found $path"; exit 1; fi
  done
  echo "no gcc, cc, g++ or make; no pip in the venv, no pip cache, no torch headers"' || fail "runtime stage is not trimmed"

step "compiled bytecode is current (a read-only root cannot cache it)"
# shellcheck disable=SC2016  # the script runs inside the container
run_ro --entrypoint sh "$image" -c '
  log="$(python -v -c "import kelp.cli.main, kelp.daemon.train, kelp.serving, torch" 2>&1)"
  stale="$(printf "%s\n" "$log" | grep -c "bytecode is stale" || true)"
  cached="$(printf "%s\n" "$log" | grep -c "code object from .*\.pyc" || true)"
  echo "$cached modules loaded from .pyc, $stale stale"
  [ "$stale" -eq 0 ] && [ "$cached" -gt 100 ]' || fail "stale or missing bytecode"

step "kelp config validate on every shipped example"
# criteo-kaggle's sample ships in the image; criteo-attribution and MovieLens
# read ../../shared/data beside the examples (MovieLens's terms forbid shipping
# it). That is this repository's data folder, mounted read-only where the
# examples look (/etc/kelp/examples/../../shared/data), so every example gets
# the full train-side check (source files and columns). Without it, those examples get the --for serve check and the
# output says so.
data="${KELP_DATA_DIR:-$root/../shared/data}"
shipped=()
for path in "$root"/examples/*.yaml; do
  shipped+=("/etc/kelp/examples/$(basename "$path")")
done
[ "${#shipped[@]}" -gt 0 ] || fail "no examples/*.yaml in the repository"
mount=()
if [ -d "$data" ]; then
  mount=(-v "$(cd "$data" && pwd):/etc/shared/data:ro")
  echo "(data folder $data mounted read-only at /etc/shared/data)"
else
  echo "(no data folder at $data: examples whose data is not in the image get --for serve)"
fi
# shellcheck disable=SC2016  # the script runs inside the container
run_ro "${mount[@]}" --entrypoint sh "$image" -c '
  for f in "$@"; do
    if ! kelp config validate "$f" 2>/tmp/err; then
      grep -q "no such file" /tmp/err && [ ! -d /etc/shared/data ] || { cat /tmp/err >&2; exit 1; }
      kelp config validate --for serve "$f" || exit 1
      echo "  ($f: its data is outside the image; checked --for serve)"
    fi
  done' sh "${shipped[@]}" || fail "kelp config validate"

step "kelp demo (embedded path: no redis-server or Kafka broker in the image)"
demo_log="$(mktemp)"
trap 'rm -f "$demo_log"' EXIT
run_ro "$image" demo 2>&1 | tee "$demo_log" || fail "kelp demo exited non-zero"
grep -q "falling back to the embedded path" "$demo_log" || fail "the demo did not take the embedded path"
grep -q "progressive AUC 0\.[0-9]" "$demo_log" || fail "the demo reported no AUC"
grep -q "^demo finished\.$" "$demo_log" || fail "the demo did not finish"

step "image size"
bytes="$(engine image inspect --format '{{.Size}}' "$image")"
echo "$image: $((bytes / 1000 / 1000)) MB ($bytes bytes)"
engine history --no-trunc --format '{{.Size}}\t{{.CreatedBy}}' "$image" | awk -F'\t' '$1 !~ /^0 ?B$/ {print "  " $1 "\t" substr($2, 1, 90)}'

printf '\nimage-test: all checks passed for %s\n' "$image"
