#!/usr/bin/env bash
# Installs the Debian 12 packages this project needs to build and test, and
# nothing that is already there. Idempotent; prints what it installs.
#
# Usage: scripts/install_deps.sh [--build-only | --runtime | --bench]
#   (no flag)     everything to build, run and test the project: the C++
#                 toolchain and libraries, Python (PyTorch oracle, client),
#                 Node.js, Prometheus, nginx and HAProxy for the gateway tests,
#                 and podman/buildah for the container test
#   --build-only  just what scripts/build.sh needs (the Docker build stage)
#   --runtime     only the shared libraries the two binaries need at run time
#                 (the Docker runtime stage)
#   --bench       everything, plus what bench/ needs: matplotlib for charts,
#                 python3-onnx and ONNX Runtime (npm) for the peer benchmark
set -euo pipefail

mode=full
for arg in "$@"; do
  case "$arg" in
    --runtime) mode=runtime ;;
    --build-only) mode=build ;;
    --bench) mode=bench ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "install_deps.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

build_pkgs=(
  build-essential cmake ninja-build pkg-config git clang-format
  libdnnl-dev ocl-icd-opencl-dev
  libabsl-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc grpc-proto
  prometheus-cpp-dev
  nlohmann-json3-dev
  # The REST front-end: cpp-httplib (HTTP/1.1, TLS) and simdjson (request JSON).
  libcpp-httplib-dev libsimdjson-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  ca-certificates
)
test_pkgs=(
  # Python: the PyTorch oracle, the Python client and its tests.
  python3 python3-numpy python3-grpcio python3-protobuf python3-torch libopenblas0-pthread
  # The gateway tests: nginx 1.22 and HAProxy 2.6 in front of replicas (run unprivileged by
  # the tests with their own configs; where the package starts a system service, it is unused).
  nginx haproxy
  # Monitoring tests, and the container test (no Docker engine here: podman).
  prometheus podman buildah runc debootstrap podman-compose uidmap python3-yaml fuse-overlayfs
  # scripts/sanitize.sh: clang, its sanitizer and libFuzzer runtimes, llvm-symbolizer, and
  # LLVM's omp.h (clang-14 cannot parse GCC 12's; the code still links GCC's libgomp).
  clang-14 libclang-rt-14-dev llvm-14 libomp-14-dev
)
bench_pkgs=(python3-matplotlib python3-onnx)
runtime_pkgs=(
  libdnnl2 ocl-icd-libopencl1 libgomp1 libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623
  libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb1 libc-ares2 libre2-9 libssl3
  libcpp-httplib0.11 libsimdjson14
)

case $mode in
  runtime) wanted=("${runtime_pkgs[@]}") ;;
  build) wanted=("${build_pkgs[@]}") ;;
  full|bench)
    wanted=("${build_pkgs[@]}" "${test_pkgs[@]}")
    [[ $mode == bench ]] && wanted+=("${bench_pkgs[@]}")
    # The Node.js client example: Debian's node and npm unless some are on PATH.
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
      wanted+=(nodejs npm)
    fi
    ;;
esac

missing=()
for p in "${wanted[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install_deps: all ${#wanted[@]} Debian packages already installed"
else
  echo "install_deps: installing ${#missing[@]} package(s): ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "install_deps: must run as root to install packages" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Node.js client's packages, pinned by client/node/package-lock.json.
node_dir="$(dirname "$0")/../client/node"
if [[ ($mode == full || $mode == bench) && -f $node_dir/package-lock.json ]]; then
  if [[ ! -d $node_dir/node_modules || $node_dir/package-lock.json -nt $node_dir/node_modules ]]; then
    echo "install_deps: npm ci in client/node (@grpc/grpc-js, @grpc/proto-loader)"
    npm ci --prefix "$node_dir" --no-audit --no-fund --loglevel=error >/dev/null
    touch "$node_dir/node_modules"
  else
    echo "install_deps: client/node/node_modules is up to date"
  fi
fi
# The peer benchmark's ONNX Runtime (its .npmrc skips the CUDA download).
peers_dir="$(dirname "$0")/../bench/peers"
if [[ $mode == bench && -f $peers_dir/package-lock.json ]]; then
  echo "install_deps: npm ci in bench/peers (onnxruntime-node)"
  (cd "$peers_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
echo "install_deps: done"
