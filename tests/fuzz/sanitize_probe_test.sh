#!/usr/bin/env bash
# scripts/sanitize.sh's toolchain probe (issue 21, item 0): on a machine
# without LLVM's OpenMP headers, or without clang's sanitizer runtimes, it
# must name the Debian package that is missing and exit non-zero before
# building; and scripts/install_deps.sh must install every package the probe
# can name.
#
# A machine without a package is simulated with a clang++-14 wrapper first on
# PATH whose resource directory (clang's own headers and runtimes) is a copy
# of links with the package's files left out.
#
# Usage: sanitize_probe_test.sh --repo DIR. Exit 77 (skipped) without clang++-14.
set -euo pipefail
repo=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --repo) repo=$2; shift 2 ;;
    *) echo "unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n $repo ]] || { echo "usage: $0 --repo DIR" >&2; exit 2; }

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# install_deps.sh installs what the probe asks for.
for package in libomp-14-dev libclang-rt-14-dev llvm-14 clang-14; do
  grep -Eq "(^|[[:space:]])$package([[:space:]]|$)" "$repo/scripts/install_deps.sh" ||
    fail "scripts/install_deps.sh does not install $package"
done

real=$(command -v clang++-14 || true)
if [[ -z $real ]]; then
  echo "SKIPPED: clang++-14 is not installed (scripts/install_deps.sh installs it)"
  exit $((failures > 0 ? 1 : 77))
fi
resource=$("$real" -print-resource-dir)
work=$(mktemp -d /tmp/sanitize-probe-test.XXXXXX)
trap 'rm -rf "$work"' EXIT

# A resource directory of links to the real one, without the files matched by
# the pattern ($2, under $1: include or lib/linux), and a clang++-14 that uses it.
fake_toolchain() {  # name, subdirectory, pattern
  local root=$work/$1
  mkdir -p "$root/resource" "$root/bin"
  local entry
  for entry in "$resource"/*; do
    [[ $(basename "$entry") == "${2%%/*}" ]] || ln -s "$entry" "$root/resource/"
  done
  mkdir -p "$root/resource/$2"
  if [[ $2 == */* ]]; then  # lib/linux: link lib's other entries too.
    for entry in "$resource/${2%%/*}"/*; do
      [[ $(basename "$entry") == "${2#*/}" ]] || ln -s "$entry" "$root/resource/${2%%/*}/"
    done
  fi
  for entry in "$resource/$2"/*; do
    # shellcheck disable=SC2053  # $3 is a glob.
    [[ $(basename "$entry") == $3 ]] || ln -s "$entry" "$root/resource/$2/"
  done
  printf '#!/bin/sh\nexec %s -resource-dir=%s "$@"\n' "$real" "$root/resource" \
    >"$root/bin/clang++-14"
  chmod +x "$root/bin/clang++-14"
  echo "$root/bin"
}

expect_missing() {  # case name, PATH directory, package expected in the message
  local out rc=0
  out=$(PATH="$2:$PATH" "$repo/scripts/sanitize.sh" --probe-only 2>&1) || rc=$?
  if [[ $rc -eq 0 ]]; then
    fail "$1: sanitize.sh --probe-only exited 0; output: $out"
  elif ! grep -q "missing Debian package.*$3" <<<"$out"; then
    fail "$1: the message does not name $3 (exit $rc); output: $out"
  else
    echo "ok: $1: exit $rc, names $3"
  fi
}

# LLVM's OpenMP headers missing (libomp-14-dev): the clean bookworm failure.
expect_missing "no omp.h" "$(fake_toolchain no-omp include 'omp*.h')" libomp-14-dev
# clang's runtimes missing (libclang-rt-14-dev): no libFuzzer, ASan or TSan.
expect_missing "no sanitizer runtimes" "$(fake_toolchain no-rt lib/linux 'libclang_rt.*')" \
  libclang-rt-14-dev

# The real toolchain passes (CI's machines have every package).
if out=$("$repo/scripts/sanitize.sh" --probe-only 2>&1); then
  echo "ok: the installed toolchain passes the probe"
else
  fail "the installed toolchain fails the probe: $out"
fi

[[ $failures -eq 0 ]] || { echo "$failures failure(s)"; exit 1; }
echo "sanitize_probe_test: all passed"
