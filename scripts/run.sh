#!/usr/bin/env bash
# Quick start: installs what is missing, builds, and runs the engine on the
# built-in demo model (E=256, 8 heads), printing latency and GFLOP/s.
# Usage (as root): scripts/run.sh [attention-core-bench flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
exec build/bin/attention-core-bench --batch=1 --seq_len=128 "$@"
