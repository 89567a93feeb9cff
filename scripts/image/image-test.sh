#!/usr/bin/env bash
# `make image-test`: builds Kelp's image (layer cache makes a rebuild cheap)
# and checks it the way an operator runs it: non-root, read-only root
# filesystem with a tmpfs on /tmp, no network unless a step needs Redis.
# Inside the image it runs `kelp --version`, `kelp config validate` on every
# shipped example and `kelp demo`. The image carries no redis-server and no
# Kafka broker, so the demo takes its embedded path (file source, in-memory
# store, the same trainer daemon); the test requires that path to finish and
# to report an AUC. Then the production path: `kelp train` from the image
# pushes to the host's redis-server and publishes, and `kelp serve` from the
# image loads that model and scores (skipped, and said so, without
# redis-server on the host). Prints the image's size and its largest layers.
# Exits 1 on the first failure.
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
# --network none unless a step sets net=host to reach a redis-server on loopback.
net=none
run_ro() { engine run "${KELP_RUN_FLAGS[@]}" --rm --read-only --tmpfs /tmp:rw,size=512m --network "$net" "$@"; }
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

step "kelp train, then kelp serve, from the image on a real redis-server"
# The production path, as the chart runs it: the trainer pushes rows and
# publishes a snapshot to Redis, a serving replica loads it and scores. The
# redis-server is the host's (the image carries none), on a free loopback port;
# the containers share the host's network to reach it.
if ! command -v redis-server >/dev/null 2>&1; then
  echo "SKIPPED: no redis-server on this host (make system-deps installs it); the demo above ran without one"
else
  free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
  redis_port="$(free_port)" metrics_port="$(free_port)" serve_port="$(free_port)"
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --loglevel warning >/dev/null 2>&1 &
  redis_pid=$!
  serve_name="kelp-image-test-serve-$$"
  trap 'rm -f "$demo_log"; kill "$redis_pid" 2>/dev/null || true; engine rm -f "$serve_name" >/dev/null 2>&1 || true' EXIT
  kelp_env=(
    -e KELP_DEPLOYMENT=image-test -e "KELP_STORE__BACKEND=redis" -e "KELP_STORE__URLS=redis://127.0.0.1:$redis_port"
    -e KELP_PUBLISHER__CHANNEL=redis -e KELP_TRAINER__CHECKPOINT_DIR=/tmp/checkpoints
    -e KELP_METRICS__HOST=127.0.0.1 -e "KELP_METRICS__PORT=$metrics_port"
    -e KELP_SERVING__HOST=127.0.0.1 -e "KELP_SERVING__PORT=$serve_port"
  )
  config=/etc/kelp/examples/criteo-kaggle.yaml
  net=host
  run_ro "${kelp_env[@]}" "$image" train --config "$config" --max-steps 8 || fail "kelp train on Redis"
  engine run "${KELP_RUN_FLAGS[@]}" -d --name "$serve_name" --read-only --tmpfs /tmp:rw,size=64m --network host \
    "${kelp_env[@]}" "$image" serve --config "$config" >/dev/null || fail "kelp serve did not start"
  net=none
  python3 - "$serve_port" <<'PY' || { engine logs "$serve_name" 2>&1 | tail -20; fail "kelp serve"; }
import json, sys, time, urllib.error, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(60):
    try:
        with urllib.request.urlopen(f"{base}/readyz", timeout=2) as reply:
            if reply.status == 200:
                break
    except (urllib.error.URLError, ConnectionError):
        pass
    time.sleep(1)
else:
    raise SystemExit("kelp serve never became ready in 60 s")
sample = {"dense": {"I1": 1.0, "I2": 3.0}, "sparse": {"C1": [68], "C2": [1287]}}
request = urllib.request.Request(
    f"{base}/v1/score", json.dumps({"samples": [sample]}).encode(), {"content-type": "application/json"}
)
with urllib.request.urlopen(request, timeout=10) as reply:
    body = json.load(reply)
score, version = body["scores"][0], body["model_version"]
assert 0.0 < score < 1.0 and version >= 1, body
print(f"kelp serve ready; POST /v1/score -> {score:.4f} from model v{version} published by the trainer")
PY
  engine rm -f "$serve_name" >/dev/null
fi

step "image size"
bytes="$(engine image inspect --format '{{.Size}}' "$image")"
echo "$image: $((bytes / 1000 / 1000)) MB ($bytes bytes)"
engine history --no-trunc --format '{{.Size}}\t{{.CreatedBy}}' "$image" | awk -F'\t' '$1 !~ /^0 ?B$/ {print "  " $1 "\t" substr($2, 1, 90)}'

printf '\nimage-test: all checks passed for %s\n' "$image"
