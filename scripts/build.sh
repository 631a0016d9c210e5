#!/usr/bin/env bash
# Configures and builds the project into build/ (executables in build/bin/).
# Usage: scripts/build.sh [extra cmake args...]
#   ATTENTION_TARGETS="attention-server attention-client" builds only those
#   targets (and what they need): the image's build stage, which ships the
#   two binaries, leaves out the tests, benchmarks and fuzzers.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [[ ! -f build/CMakeCache.txt ]]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
fi
targets=()
if [[ -n ${ATTENTION_TARGETS:-} ]]; then
  read -r -a names <<<"$ATTENTION_TARGETS"
  targets=(--target "${names[@]}")
fi
cmake --build build --parallel "$(nproc)" "${targets[@]}"
