#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: installs what is
# missing, builds, and runs every test through CTest, then the sanitizer
# builds and the fuzzers (scripts/sanitize.sh).
# Usage (as root): scripts/test.sh [ctest args...]
#   With ctest arguments (e.g. -R server_) only those tests run, without the
#   sanitizers; SANITIZE=0 skips the sanitizers too.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh test
scripts/build.sh
(
  cd build
  ctest --output-on-failure --timeout 1500 -j "$(nproc)" "$@"
)
if [[ $# -eq 0 && ${SANITIZE:-1} != 0 ]]; then
  scripts/sanitize.sh
fi
