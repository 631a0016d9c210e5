#!/usr/bin/env bash
# python_package_test: the Python client as a user installs it. Copies what the package build
# reads (client/python, proto/, the top CMakeLists.txt for the version) to a temporary folder,
# makes a fresh virtual environment there with Debian's packages visible
# (/usr/bin/python3 -m venv --system-site-packages: grpcio, protobuf, numpy), installs the
# package with `pip install ./client/python` as the guide says (its build backend needs only
# the standard library: offline, with pip's build isolation), and runs the client's tests,
# copied out of the repository, from another temporary folder against the installed package
# (no PYTHONPATH, no ATTENTION_PY_GEN; test_usage.py checks that the package imported is the
# installed one).
#
# Usage: installed_test.sh REPO SERVER_BINARY VERSION [test module...]
set -euo pipefail
repo=$1 server=$2 version=$3
shift 3
modules=("$@")
[[ ${#modules[@]} -gt 0 ]] || modules=(test_usage test_client test_security test_exit)

work=$(mktemp -d /tmp/attention-python-package.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/client" "$work/run"
cp -r "$repo/client/python" "$work/src/client/"
cp -r "$repo/proto" "$work/src/proto"
cp "$repo/CMakeLists.txt" "$work/src/"
rm -rf "$work/src/client/python/build" "$work/src/client/python/"*.egg-info
cp "$repo"/client/python/tests/test_*.py "$work/run/"

unset PYTHONPATH ATTENTION_PY_GEN
echo "[python_package_test] python3 -m venv --system-site-packages $work/venv"
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
echo "[python_package_test] pip install ./client/python"
(cd "$work/src" && "$work/venv/bin/pip" install --no-input --disable-pip-version-check \
   ./client/python 2>&1 | tail -3)
"$work/venv/bin/pip" show attention-client | sed -n '1,2p'

cd "$work/run"
echo "[python_package_test] running ${modules[*]} from $work/run"
ATTENTION_EXPECT_INSTALLED=1 ATTENTION_VERSION="$version" ATTENTION_SERVER_BINARY="$server" \
  ATTENTION_REPO="$repo" "$work/venv/bin/python" -m unittest -v "${modules[@]}"
