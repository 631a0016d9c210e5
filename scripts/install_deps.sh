#!/usr/bin/env bash
# Installs the Debian 12 packages (and npm packages) a command of this project
# needs, and nothing that is already there. Idempotent; says what it installs
# and why, shows apt's progress, and prints how long it took.
#
# Usage: scripts/install_deps.sh [PROFILE]
#   run      (default) what scripts/build.sh and serving need: the C++
#            toolchain and libraries (scripts/run.sh uses this)
#   test     run, plus what the tests need: Python (PyTorch oracle, grpcio
#            client, venv/pip for the package test), Node.js and its npm
#            packages, Prometheus, podman/buildah for the container test,
#            clang/LLVM for the sanitizers, Graphviz for the docs' picture
#            (scripts/test.sh uses this)
#   bench    test, plus what bench/ needs: matplotlib for charts, python3-onnx
#            and ONNX Runtime (npm) for the peer benchmark
#   runtime  only the shared libraries the two binaries need at run time
#            (the Docker runtime stage)
# The old flags still work: --build-only (= run), --runtime, --bench.
set -euo pipefail

profile=run
for arg in "$@"; do
  case "$arg" in
    run|test|bench|runtime) profile=$arg ;;
    --build-only) profile=run ;;
    --runtime) profile=runtime ;;
    --bench) profile=bench ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "install_deps.sh: unknown argument '$arg' (profiles: run, test, bench, runtime)" >&2
       exit 2 ;;
  esac
done
started=$SECONDS

# What each group is for; a profile installs the groups it names.
build_pkgs=(
  build-essential cmake ninja-build pkg-config git clang-format
  libdnnl-dev ocl-icd-opencl-dev
  libabsl-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc grpc-proto
  prometheus-cpp-dev
  nlohmann-json3-dev
  # The REST front-end: Boost.Beast on Asio (HTTP/1.1 server, header-only; libboost1.81-dev,
  # whose parser bounds every read; the tests' HTTP client too); simdjson only for attention-rest-json-memory's comparison
  # (the server reads JSON with its own in-place reader).
  libboost1.81-dev libsimdjson-dev
  # zlib: REST's gzip and deflate bodies and responses (rest_compression), and the tests'.
  zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  ca-certificates
)
test_pkgs=(
  # Python: the PyTorch oracle, the Python client and its tests (the package test builds a
  # wheel with setuptools/wheel and installs it into a venv).
  python3 python3-numpy python3-grpcio python3-protobuf python3-torch libopenblas0-pthread
  python3-venv python3-pip python3-setuptools python3-wheel
  # Monitoring tests, and the container test (no Docker engine here: podman).
  prometheus podman buildah runc debootstrap podman-compose uidmap python3-yaml fuse-overlayfs
  # The gateway tests: nginx 1.22 and HAProxy 2.6 in front of replicas (run unprivileged).
  nginx haproxy
  # The documentation test: docs/architecture.svg is what Graphviz's dot makes of the .dot.
  graphviz
  # scripts/sanitize.sh: clang, its sanitizer and libFuzzer runtimes, llvm-symbolizer, and
  # LLVM's omp.h (clang-14 cannot parse GCC 12's; the code still links GCC's libgomp).
  clang-14 libclang-rt-14-dev llvm-14 libomp-14-dev
)
bench_pkgs=(python3-matplotlib python3-onnx)
runtime_pkgs=(
  libdnnl2 ocl-icd-libopencl1 libgomp1 libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623
  libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb1 libc-ares2 libre2-9 libssl3
  zlib1g
)

case $profile in
  runtime) wanted=("${runtime_pkgs[@]}") ;;
  run) wanted=("${build_pkgs[@]}") ;;
  test|bench)
    wanted=("${build_pkgs[@]}" "${test_pkgs[@]}")
    [[ $profile == bench ]] && wanted+=("${bench_pkgs[@]}")
    # The Node.js client: Debian's node and npm unless some are on PATH.
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
  echo "install_deps ($profile): all ${#wanted[@]} Debian packages already installed"
else
  echo "install_deps ($profile): installing ${#missing[@]} of ${#wanted[@]} package(s): ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "install_deps: must run as root to install packages" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  # apt's own progress (downloads, then one line per package unpacked and set up).
  apt-get install -y --no-install-recommends -o Dpkg::Progress-Fancy=0 "${missing[@]}"
  echo "install_deps ($profile): Debian packages installed in $((SECONDS - started)) s"
fi

# The Node.js client's packages (@grpc/grpc-js, @grpc/proto-loader, and typescript for the type
# check of its declarations), pinned by client/node/package-lock.json.
node_dir="$(dirname "$0")/../client/node"
if [[ ($profile == test || $profile == bench) && -f $node_dir/package-lock.json ]]; then
  if [[ ! -d $node_dir/node_modules || $node_dir/package-lock.json -nt $node_dir/node_modules ]]; then
    echo "install_deps ($profile): npm ci in client/node (@grpc/grpc-js, @grpc/proto-loader, typescript)"
    npm ci --prefix "$node_dir" --no-audit --no-fund --loglevel=error
    touch "$node_dir/node_modules"
  else
    echo "install_deps ($profile): client/node/node_modules is up to date"
  fi
fi
# The peer benchmark's ONNX Runtime (its .npmrc skips the CUDA download).
peers_dir="$(dirname "$0")/../bench/peers"
if [[ $profile == bench && -f $peers_dir/package-lock.json ]]; then
  echo "install_deps ($profile): npm ci in bench/peers (onnxruntime-node)"
  (cd "$peers_dir" && npm ci --no-audit --no-fund --loglevel=error)
fi
echo "install_deps ($profile): done in $((SECONDS - started)) s"
