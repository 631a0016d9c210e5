#!/usr/bin/env bash
# Configures and builds the project into build/ (executables in build/bin/).
# Usage: scripts/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [[ ! -f build/CMakeCache.txt ]]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build build --parallel "$(nproc)"
