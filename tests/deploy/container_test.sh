#!/usr/bin/env bash
# The real container test, from nothing: make the debian:bookworm-slim base
# image if it is missing (debootstrap from this machine's apt mirror), build
# docker/Dockerfile with podman, run it read-only as non-root on free
# loopback ports, wait for health, send requests with attention-client (and
# the Python client when present), scrape /metrics, run the image's
# HEALTHCHECK, stop it with SIGTERM and check a clean exit, check the memory
# plan under --memory=1g (refusal of explicit budgets over the limit, then a
# flood of 16 MiB requests survived within the limit), then remove every
# container and image it made.
#
# Usage: tests/deploy/container_test.sh [--repo DIR] [--build DIR]
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
build="$repo/build"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --repo) repo=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

log() { echo "[container_test] $*"; }
fail() { echo "[container_test] FAIL: $*" >&2; exit 1; }

# CTest reads this exit code as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt).
readonly SKIP=77
skip() {
  echo "[container_test] SKIPPED: $* -- run the suite on a VM, a bare machine or in a privileged container (podman run --privileged) to include this test" >&2
  exit $SKIP
}

command -v podman >/dev/null || fail "podman is not installed (scripts/install_deps.sh installs it)"
[[ $(id -u) -eq 0 ]] || skip "podman here needs root (it runs with runc and cgroupfs)"
# podman needs mount and PID namespaces: an unprivileged container has neither.
unshare --mount --pid --fork true 2>/dev/null \
  || skip "no privileges to create namespaces (an unprivileged container?)"

work=$(mktemp -d /tmp/attention-container-test.XXXXXX)
tag="localhost/attention-service:test-$$"
name="attention-test-$$"
base="docker.io/library/debian:bookworm-slim"
made_base=0

volumes_before=$(podman volume ls -q | sort)

cleanup() {
  set +e
  podman rm -f -v "$name" "$name-models" "$name-plan" "$name-flood" >/dev/null 2>&1
  podman rmi -f "$tag" >/dev/null 2>&1
  podman image prune -f >/dev/null 2>&1  # The build stage's dangling layers.
  if [[ $made_base == 1 ]]; then podman rmi -f "$base" >/dev/null 2>&1; fi
  # Anonymous volumes (the image's VOLUME /models) this test's containers made.
  for volume in $(comm -13 <(echo "$volumes_before") <(podman volume ls -q | sort)); do
    podman volume rm -f "$volume" >/dev/null 2>&1
  done
  if [[ -n ${CONTAINERS_STORAGE_CONF:-} ]]; then
    # Everything in the private store (its mounts must go before rm -rf).
    podman rm -af >/dev/null 2>&1
    podman rmi -af >/dev/null 2>&1
    umount -R "$work/storage" >/dev/null 2>&1
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# podman on this machine kind (cgroups v1, no CAP_SYS_RESOURCE) needs runc,
# cgroupfs and explicit ulimits.
cat > "$work/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
export CONTAINERS_CONF="$work/containers.conf"

# podman's default storage is overlay under /var/lib/containers, which cannot
# work on an overlay root (inside a container: "'overlay' is not supported over
# overlayfs"). There, use a private store under $work, so the user's own
# storage is never touched: fuse-overlayfs as overlay's mount program when
# /dev/fuse is there, else the vfs driver (slower, always works).
storage_fs=$(stat -f -c %T /var/lib/containers 2>/dev/null || stat -f -c %T /)
if [[ $storage_fs == overlayfs ]]; then
  if [[ -c /dev/fuse ]] && command -v fuse-overlayfs >/dev/null; then
    driver=overlay
    options='mount_program = "/usr/bin/fuse-overlayfs"'
  else
    driver=vfs
    options=""
  fi
  mkdir -p "$work/storage" "$work/storage-run"
  cat > "$work/storage.conf" <<CONF
[storage]
driver = "$driver"
graphroot = "$work/storage"
runroot = "$work/storage-run"
[storage.options.overlay]
$options
CONF
  export CONTAINERS_STORAGE_CONF="$work/storage.conf"
  log "storage on $storage_fs: a private $driver store under $work${options:+ (fuse-overlayfs)}"
fi
podman info >"$work/podman-info.txt" 2>&1 \
  || { cat "$work/podman-info.txt" >&2; skip "podman cannot start here (see its message above)"; }

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start=$(date +%s)
if ! podman image exists "$base"; then
  log "making $base with debootstrap (minbase) from this machine's apt mirror"
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  [[ -n $mirror ]] || fail "no mirror in /etc/apt/sources.list.d/debian.sources"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log"; fail "debootstrap failed"; }
  rm -f "$work/rootfs/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/debian.sources "$work/rootfs/etc/apt/sources.list.d/"
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
  tar --numeric-owner -C "$work/rootfs" -c . | podman import - "$base" >/dev/null
  rm -rf "$work/rootfs"
  made_base=1
fi

log "building the image from docker/Dockerfile"
podman build --format docker --isolation chroot -f "$repo/docker/Dockerfile" -t "$tag" "$repo" \
  >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; fail "podman build failed"; }
size=$(podman image inspect --format '{{.Size}}' "$tag")
log "image built in $(( $(date +%s) - start )) s; runtime image size $(( size / 1000000 )) MB"
[[ $size -lt 300000000 ]] || log "WARNING: image is over 300 MB"

grpc_port=$(free_port)
metrics_port=$(free_port)
log "running on 127.0.0.1:$grpc_port (metrics $metrics_port), read-only root, non-root user"
podman run -d --name "$name" --read-only --cap-drop=ALL \
  -p "127.0.0.1:$grpc_port:50051" -p "127.0.0.1:$metrics_port:9464" "$tag" \
  --max_batch_size=8 >/dev/null
[[ $(podman inspect --format '{{.Config.User}}' "$name") == 10001 ]] || fail "not running as uid 10001"

client="$build/bin/attention-client"
for _ in $(seq 300); do
  if "$client" health --server="127.0.0.1:$grpc_port" --deadline_ms=500 >/dev/null 2>&1; then break; fi
  [[ $(podman inspect --format '{{.State.Running}}' "$name") == true ]] \
    || { podman logs "$name"; fail "container exited during start-up"; }
  sleep 0.1
done
"$client" health --server="127.0.0.1:$grpc_port" || { podman logs "$name"; fail "never SERVING"; }

log "sending requests with attention-client"
"$client" models --server="127.0.0.1:$grpc_port" >"$work/demo_models.txt"
grep -q "demo" "$work/demo_models.txt" || fail "models does not list demo"
"$client" infer --server="127.0.0.1:$grpc_port" --batch=2 --seq_len=16 --need_weights \
  --output="$work/out.npy" | tee "$work/infer.txt"
grep -q "output      \[2, 16, 256\] float32" "$work/infer.txt" || fail "unexpected infer output"
"$client" load --server="127.0.0.1:$grpc_port" --concurrency=4 --requests=200 --seq_len=8:64 \
  | tee "$work/load.txt"

if [[ -f "$repo/client/python/attention_client/__init__.py" ]] && \
   /usr/bin/python3 -c 'import grpc, numpy' 2>/dev/null; then
  log "sending a request with the Python client"
  ATTENTION_PY_GEN="${ATTENTION_PY_GEN:-$build/client/python/gen}" \
  PYTHONPATH="$repo/client/python" /usr/bin/python3 - "$grpc_port" <<'PY'
import sys
import numpy as np
from attention_client import AttentionClient
client = AttentionClient(f"127.0.0.1:{sys.argv[1]}")
assert client.health(), "not serving"
result = client.infer(np.random.default_rng(0).standard_normal((1, 8, 256), dtype=np.float32))
assert result.output.shape == (1, 8, 256), result.output.shape
print("python client: output", result.output.shape, "batch_requests", result.batch_requests)
PY
else
  log "Python client not present: skipped its request"
fi

log "scraping /metrics"
metrics=$(/usr/bin/python3 -c "import urllib.request,sys; print(urllib.request.urlopen('http://127.0.0.1:$metrics_port/metrics').read().decode())")
for metric in attention_request_duration_seconds_bucket attention_requests_total attention_flops_total \
              attention_queue_depth attention_build_info; do
  grep -q "^$metric" <<<"$metrics" || fail "/metrics lacks $metric"
done
ok=$(grep '^attention_requests_total{.*code="OK".*method="Infer"' <<<"$metrics" | awk '{s+=$2} END {print s+0}')
[[ ${ok%.*} -ge 201 ]] || fail "expected at least 201 OK requests in /metrics, saw $ok"

log "running the image's HEALTHCHECK"
podman healthcheck run "$name" || fail "HEALTHCHECK failed"

log "stopping with SIGTERM"
podman stop -t 40 "$name" >/dev/null
code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
podman logs "$name" >"$work/server.log" 2>&1
tail -5 "$work/server.log"
[[ $code == 0 ]] || fail "exit code $code after SIGTERM"
grep -q "received SIGTERM: draining" "$work/server.log" || fail "no drain on SIGTERM"

log "serving a mounted model repository at /models"
/usr/bin/python3 "$repo/scripts/export_torch_mha.py" --embed_dim 32 --num_heads 4 \
  --out "$work/models/tiny" >/dev/null || fail "export_torch_mha.py failed"
chmod -R a+rX "$work/models"
mounted_port=$(free_port)
podman run -d --name "$name-models" --read-only -v "$work/models:/models:ro" \
  -p "127.0.0.1:$mounted_port:50051" "$tag" --metrics_port=0 >/dev/null
for _ in $(seq 300); do
  "$client" health --server="127.0.0.1:$mounted_port" --deadline_ms=500 >/dev/null 2>&1 && break
  sleep 0.1
done
"$client" models --server="127.0.0.1:$mounted_port" | tee "$work/models.txt"
podman rm -f -v "$name-models" >/dev/null
grep -q "^tiny \*" "$work/models.txt" || fail "the mounted model 'tiny' is not served"

log "memory plan: explicit budgets over a 1 GiB limit are refused at start"
code=0
podman run --name "$name-plan" --memory=1g --read-only "$tag" --metrics_port=0 \
  --max_inflight_bytes=805306368 --session_memory_bytes=268435456 >"$work/plan.log" 2>&1 || code=$?
podman rm -f "$name-plan" >/dev/null
[[ $code == 1 ]] || { cat "$work/plan.log"; fail "expected exit 1 for budgets over the limit, got $code"; }
grep -q -- "--max_inflight_bytes=805306368 + --session_memory_bytes=268435456" "$work/plan.log" \
  || { cat "$work/plan.log"; fail "the refusal does not name the flags"; }

# Issue 21 (3b): under --memory=1g with the defaults, 64 concurrent 16 MiB
# requests got the server OOM-killed (exit 137): its budgets were each a
# fraction of the limit but summed past it, and malloc kept what the flood
# had freed (750 MiB resident at rest). Now: it survives, every request is
# answered or refused, the peak stays under the limit, and once idle it
# holds no more than its plan lets it keep (baseline, kept workspaces and
# the allocator reserve).
log "flood under --memory=1g with the defaults: 64 concurrent 16 MiB requests for 8 s"
flood_port=$(free_port)
podman run -d --name "$name-flood" --memory=1g --read-only --cap-drop=ALL \
  -p "127.0.0.1:$flood_port:50051" "$tag" --metrics_port=0 >/dev/null
for _ in $(seq 300); do
  "$client" health --server="127.0.0.1:$flood_port" --deadline_ms=500 >/dev/null 2>&1 && break
  sleep 0.1
done
podman logs "$name-flood" >"$work/flood-server.log" 2>&1
grep -A9 "^memory plan" "$work/flood-server.log"
plan_line() { awk -v n="$1" '$1 == n {print $2; exit}' "$work/flood-server.log"; }
for line in baseline max_inflight_bytes grpc_receive_quota_bytes session_memory_bytes \
            workspaces_kept allocator_reserve total; do
  [[ -n $(plan_line $line) ]] || fail "the start-up memory plan has no '$line' line"
done
limit=$((1 << 30))
"$client" load --server="127.0.0.1:$flood_port" --concurrency=64 --seq_len=16384 --duration=8s \
  --deadline_ms=20000 | tee "$work/flood.txt" || true
read_peak() {  # The container's peak memory: cgroup v2, v1, else the server's VmHWM.
  podman exec "$name-flood" sh -c 'cat /sys/fs/cgroup/memory.peak 2>/dev/null \
    || cat /sys/fs/cgroup/memory/memory.max_usage_in_bytes 2>/dev/null \
    || awk "/^VmHWM/ {print \$2 * 1024}" /proc/1/status'
}
if [[ $(podman inspect --format '{{.State.Running}}' "$name-flood") != true ]]; then
  podman logs "$name-flood" 2>&1 | grep -v "request failed" | tail -5
  fail "the server died under the flood: exit code $(podman inspect --format '{{.State.ExitCode}}' "$name-flood") (137: OOM-killed)"
fi
peak=$(read_peak)
log "peak memory $((peak >> 20)) MiB of the $((limit >> 20)) MiB limit"
[[ $peak -lt $limit ]] || fail "peak memory $peak bytes reached the limit $limit"
# Every request got an answer or a refusal: no transport failure, nothing unknown.
result=$(awk '$1 == 64' "$work/flood.txt")
answered=$(awk '{print $2}' <<<"$result")
[[ -n $answered ]] || fail "attention-client load printed no result"
for error in $(grep -o '[A-Z_]*=[0-9]*' <<<"$result"); do
  case ${error%%=*} in
    RESOURCE_EXHAUSTED|DEADLINE_EXCEEDED) ;;
    *) fail "flood: $error (only answers, RESOURCE_EXHAUSTED and DEADLINE_EXCEEDED expected)" ;;
  esac
done
"$client" infer --server="127.0.0.1:$flood_port" --seq_len=16 >/dev/null \
  || fail "the server does not answer after the flood"
# Once idle, what it holds falls back within the plan (polled: the last
# admitted requests may still be computing, and the trimmer checks every 0.1 s).
keep=$(( $(plan_line baseline) + $(plan_line workspaces_kept) + $(plan_line allocator_reserve) ))
for _ in $(seq 600); do
  rss=$(podman exec "$name-flood" awk '/^VmRSS/ {print $2 * 1024}' /proc/1/status)
  [[ $rss -le $keep ]] && break
  sleep 0.1
done
log "at rest: resident $((rss >> 20)) MiB (the plan keeps at most $((keep >> 20)) MiB when idle)"
[[ $rss -le $keep ]] || fail "idle after the flood the server holds $rss bytes, over the $keep its plan keeps"
podman rm -f "$name-flood" >/dev/null

log "bringing up docker/compose.yaml's attention-server with podman-compose"
if command -v podman-compose >/dev/null; then
  project="attncompose$$"
  compose_port=$(free_port)
  compose_metrics=$(free_port)
  mkdir -p "$work/compose/models"
  # The same file with free loopback ports (and no build: the image exists).
  sed -e "s|\"50051:50051\"|\"127.0.0.1:$compose_port:50051\"|" \
      -e "s|\"9464:9464\"|\"127.0.0.1:$compose_metrics:9464\"|" \
      "$repo/docker/compose.yaml" >"$work/compose/compose.yaml"
  podman tag "$tag" localhost/attention-service:latest
  compose() { podman-compose -p "$project" -f "$work/compose/compose.yaml" "$@"; }
  compose_down() {
    compose down -v >/dev/null 2>&1
    podman network rm -f "${project}_default" >/dev/null 2>&1
    podman volume rm -f "${project}_prometheus-data" >/dev/null 2>&1
    podman rmi localhost/attention-service:latest >/dev/null 2>&1
  }
  if compose up -d --no-build attention-server >"$work/compose.log" 2>&1; then
    for _ in $(seq 300); do
      "$client" health --server="127.0.0.1:$compose_port" --deadline_ms=500 >/dev/null 2>&1 && break
      sleep 0.1
    done
    if "$client" infer --server="127.0.0.1:$compose_port" --seq_len=8 >/dev/null; then
      log "compose: attention-server serves on its mapped port"
    else
      compose logs >&2 || true
      compose_down
      fail "compose: the server did not answer"
    fi
  else
    cat "$work/compose.log" >&2
    compose_down
    fail "podman-compose up failed"
  fi
  compose_down
  for image in docker.io/prom/prometheus:v2.42.0 docker.io/grafana/grafana:10.4.2; do
    if ! podman image exists "$image"; then
      log "compose: SKIP $image: it cannot be pulled here (no registry); the Prometheus config,"
      log "  rules and dashboard queries are checked against Debian's prometheus by monitoring_test"
    fi
  done
else
  fail "podman-compose is not installed (scripts/install_deps.sh installs it)"
fi

log "PASS in $(( $(date +%s) - start )) s"
