#!/usr/bin/env bash
# Quick start: installs what is missing, builds, and runs attention-server on
# the built-in demo model (E=256, 8 heads): gRPC on :50051, REST on :8000,
# /metrics on :9464.
# Usage (as root): scripts/run.sh [attention-server flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh run
scripts/build.sh
exec build/bin/attention-server "$@"
