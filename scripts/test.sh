#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: installs what is
# missing, builds, and runs every test through CTest.
# Usage (as root): scripts/test.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
cd build
ctest --output-on-failure --timeout 1500 -j "$(nproc)" "$@"
