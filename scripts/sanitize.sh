#!/usr/bin/env bash
# Sanitizer builds and fuzzing, as CI runs them after the test suite:
#   1. build-asan/ (clang, AddressSanitizer + UndefinedBehaviorSanitizer,
#      which halts on the first error): the core, codec, client and server
#      test binaries and the fuzz regression test, then the libFuzzer
#      targets for a bounded time each, from the committed seed corpora;
#   2. build-tsan/ (clang, ThreadSanitizer): the engine, the batcher and the
#      in-flight budget driven from many threads (not through gRPC).
# Build directories are configured once and reused; only the targets run here
# are built. Prints the wall time of each phase and the total. Exits non-zero
# on any sanitizer report, failing test or fuzzer crash.
#
# First, a probe: tiny programs compiled the way the builds compile (omp.h
# with -fopenmp=libgomp; -fsanitize=fuzzer,address,undefined; -fsanitize=thread)
# and the symbolizer. If one fails, it names the Debian package that is
# missing (scripts/install_deps.sh installs them all) and exits 1 before
# building anything.
#
# Usage: scripts/sanitize.sh [--fuzz-seconds N] [--fuzz-jobs N] [--fuzz-only] [--no-fuzz]
#                            [--probe-only]
#   --fuzz-seconds N  how long each fuzz target runs (default 45)
#   --fuzz-jobs N     fuzz targets run at once (default 2, one per core here)
#   --fuzz-only       build the fuzzers and fuzz, nothing else (for long runs)
#   --no-fuzz         the sanitizer test runs only
#   --probe-only      the toolchain probe only
#
# A crash leaves its input in the printed artifacts folder: fix the bug, then
# copy the input into tests/fuzz/regressions/<target>/ so that
# fuzz_regression_test keeps it fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

fuzz_seconds=45
fuzz_jobs=2
do_tests=1
do_fuzz=1
probe_only=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --fuzz-seconds) fuzz_seconds=$2; shift 2 ;;
    --fuzz-jobs) fuzz_jobs=$2; shift 2 ;;
    --fuzz-only) do_tests=0; shift ;;
    --no-fuzz) do_fuzz=0; shift ;;
    --probe-only) probe_only=1; shift ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "sanitize.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

cxx=clang++-14
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "sanitize.sh: $cxx not found (scripts/install_deps.sh installs it)" >&2
  exit 1
fi
export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-14/bin/llvm-symbolizer
export TSAN_SYMBOLIZER_PATH=$ASAN_SYMBOLIZER_PATH

# The toolchain probe. Each check: what is compiled, the package that
# provides what it needs, and the compiler's first error.
probe() {
  local dir
  dir=$(mktemp -d /tmp/sanitize-probe.XXXXXX)
  local missing=()
  check() {  # package, what, file, compiler args...
    local package=$1 what=$2 file=$3
    shift 3
    if ! "$cxx" "$@" "$dir/$file" -o "$dir/a.out" >"$dir/log" 2>&1; then
      echo "sanitize.sh: probe failed: $what" >&2
      grep -m1 -E "error|cannot find|not found" "$dir/log" | sed 's/^/    /' >&2 || true
      echo "    missing Debian package: $package" >&2
      missing+=("$package")
    fi
  }
  printf '#include <omp.h>\nint main() { return omp_get_max_threads() > 0 ? 0 : 1; }\n' \
    >"$dir/omp.cc"
  printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' \
    >"$dir/fuzz.cc"
  printf 'int main() { return 0; }\n' >"$dir/main.cc"
  # LLVM's omp.h, in clang's resource directory; the build links GCC's libgomp.
  check libomp-14-dev "'#include <omp.h>' with $cxx -fopenmp=libgomp" omp.cc -fopenmp=libgomp -c
  check libclang-rt-14-dev "$cxx -fsanitize=fuzzer,address,undefined (libFuzzer, ASan, UBSan)" \
    fuzz.cc -fsanitize=fuzzer,address,undefined
  check libclang-rt-14-dev "$cxx -fsanitize=thread (TSan)" main.cc -fsanitize=thread
  if [[ ! -x $ASAN_SYMBOLIZER_PATH ]]; then
    echo "sanitize.sh: probe failed: $ASAN_SYMBOLIZER_PATH not found" >&2
    echo "    missing Debian package: llvm-14" >&2
    missing+=(llvm-14)
  fi
  if [[ $(g++ -print-file-name=libgomp.so) != /* ]]; then
    echo "sanitize.sh: probe failed: GCC's libgomp.so not found (g++ -print-file-name=libgomp.so)" >&2
    echo "    missing Debian package: libgcc-12-dev" >&2
    missing+=(libgcc-12-dev)
  fi
  rm -rf "$dir"
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "sanitize.sh: missing Debian package(s): $(printf '%s\n' "${missing[@]}" | sort -u | paste -sd ' ')" >&2
    echo "    install them with: sudo scripts/install_deps.sh (or apt-get install them)" >&2
    return 1
  fi
  echo "== sanitize: toolchain probe ok ($cxx: omp.h, libFuzzer, ASan, UBSan, TSan, symbolizer)"
}
probe || exit 1
[[ $probe_only == 1 ]] && exit 0

total_start=$(date +%s)
timings=()
phase_start=0
begin() {
  phase_start=$(date +%s)
  echo "== sanitize: $1"
}
end() {
  local seconds=$(($(date +%s) - phase_start))
  timings+=("$(printf '%-34s %4d s' "$1" "$seconds")")
  echo "== sanitize: $1 took ${seconds} s"
}
summary() {
  echo "== sanitize: wall time per phase"
  local t
  for t in "${timings[@]}"; do echo "   $t"; done
  echo "   $(printf '%-34s %4d s' total $(($(date +%s) - total_start)))"
}
trap summary EXIT  # Also when a build fails.

# Debian's OpenMP runtime, as oneDNN uses it: clang's own (libomp) would load
# a second runtime into the process. (With libgomp clang compiles our few
# `omp parallel` loops serially; oneDNN keeps its threads.)
gomp=$(g++ -print-file-name=libgomp.so)
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx"
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only"
        -DOpenMP_CXX_FLAGS=-fopenmp=libgomp -DOpenMP_CXX_LIB_NAMES=gomp
        -DOpenMP_gomp_LIBRARY="$gomp")
# core/ passes GCC-only -Wno-* options to one file; clang would warn about
# each. (The GCC build in build/ is the one kept warning-free.)
quiet="-Wno-unknown-warning-option"

configure() {  # dir, flags, extra cmake args...
  local dir=$1 flags=$2
  shift 2
  if [[ ! -f $dir/CMakeCache.txt ]]; then
    cmake -S . -B "$dir" "${common[@]}" "-DCMAKE_CXX_FLAGS=$flags $quiet" "$@" >/dev/null
  fi
}

asan_tests=(core_test wire_codec_test client_cli_unit_test fuzz_regression_test
            attention_api_infer_test batching_test memory_admission_test
            monitoring_metrics_test sessions_session_test sessions_lifecycle_test
            process_shutdown_test attention_api_async_infer_test
            attention_api_async_infer_queue_test attention_api_async_infer_parse_test
            memory_async_infer_memory_test
            model_lifecycle_version_holds_test model_lifecycle_churn_test
            model_lifecycle_rollout_test rest_hostile_test rest_connections_test)
fuzzers=(model_dir_fuzzer infer_request_fuzzer npy_fuzzer session_fuzzer oip_request_fuzzer
         rest_request_fuzzer http_request_fuzzer)
# TSan: our own cross-thread code, driven directly from many threads: the
# engine, the dynamic batcher (enqueue, batch, answer, stop, cancel) and the
# in-flight budget. Not through gRPC: Debian's gRPC is uninstrumented, and
# its callback API hands call state (op sets, callback tags, the in-process
# transport's message bytes) between its threads through lock-free queues
# TSan cannot see, so every end-to-end binary was reported racing inside
# gRPC's own objects (on a clean Debian 12 container, 3 runs of 3). REST's
# HTTP server is ours and Asio is header-only, so it is instrumented whole:
# HttpServerTest drives it from raw sockets.
tsan_runs=(
  "core_engine_tsan_test --gtest_filter=MhaEngineTest.ConcurrentCalls*"
  "server_unit_test --gtest_filter=DynamicBatcherTest.*:DynamicBatcherTenantsTest.*:InflightBudgetTest.*:HttpServerTest.*:ParsePoolTest.*"
)
tsan_targets=(core_engine_tsan_test server_unit_test)

# One OpenMP thread for engines that do not set their own count (the test
# servers set 2; oneDNN is uninstrumented either way).
export OMP_NUM_THREADS=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1:strict_init_order=1
# The churn test (every kind of call while versions change and a drain
# starts) runs for 40 s here, 10 s in the ordinary suite.
export CHURN_SECONDS=${CHURN_SECONDS:-40}

failed=()
runs=0  # Test binaries and fuzz targets run.
run_test() {  # dir, binary, args...
  local dir=$1 bin=$2
  shift 2
  runs=$((runs + 1))
  local log
  log=$(mktemp "/tmp/sanitize.$bin.XXXXXX")
  local start=$(date +%s)
  if "$dir/bin/$bin" "$@" >"$log" 2>&1; then
    echo "   ok   $bin $* ($(($(date +%s) - start)) s)"
    rm -f "$log"
  else
    echo "   FAIL $bin $* ($(($(date +%s) - start)) s): log follows (kept in $log)"
    grep -E "ERROR: |WARNING: ThreadSanitizer|runtime error|SUMMARY|\[  FAILED" "$log" | head -20 || true
    tail -60 "$log"
    failed+=("$(basename "$dir") $bin")
  fi
}

asan_flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -fsanitize=fuzzer-no-link"
begin "build-asan (configure + build)"
configure build-asan "$asan_flags" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" \
  -DATTENTION_FUZZERS=ON
asan_build=("${fuzzers[@]}")
[[ $do_tests == 1 ]] && asan_build+=("${asan_tests[@]}")
cmake --build build-asan --parallel "$(nproc)" --target "${asan_build[@]}"
end "build-asan (configure + build)"

if [[ $do_tests == 1 ]]; then
  begin "ASan+UBSan tests"
  for t in "${asan_tests[@]}"; do run_test build-asan "$t"; done
  end "ASan+UBSan tests"
fi

if [[ $do_fuzz == 1 ]]; then
  begin "fuzzing (${#fuzzers[@]} x ${fuzz_seconds} s, ${fuzz_jobs} at once)"
  work=$(mktemp -d /tmp/sanitize-fuzz.XXXXXX)
  pids=()
  names=()
  for f in "${fuzzers[@]}"; do
    # A copy of the seeds: what the fuzzer adds stays out of the repository.
    mkdir -p "$work/$f/artifacts"
    cp -r "tests/fuzz/corpus/$f" "$work/$f/corpus"
    build-asan/bin/$f "$work/$f/corpus" -max_total_time="$fuzz_seconds" -timeout=30 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/$f/artifacts/" \
      >"$work/$f/log" 2>&1 &
    pids+=($!)
    names+=("$f")
    while [[ $(jobs -rp | wc -l) -ge $fuzz_jobs ]]; do sleep 1; done
  done
  for i in "${!pids[@]}"; do
    f=${names[$i]}
    runs=$((runs + 1))
    if wait "${pids[$i]}"; then
      units=$(grep -o 'number_of_executed_units: *[0-9]*' "$work/$f/log" | grep -o '[0-9]*$' || true)
      echo "   ok   $f: ${units:-?} inputs, no crash"
    else
      echo "   FAIL $f crashed: input(s) in $work/$f/artifacts/; log $work/$f/log"
      grep -E "ERROR: |runtime error|fuzz bug|SUMMARY|Test unit written" "$work/$f/log" | head -20 || true
      failed+=("fuzz $f")
    fi
  done
  [[ ${#failed[@]} -eq 0 ]] && rm -rf "$work"
  end "fuzzing (${#fuzzers[@]} x ${fuzz_seconds} s, ${fuzz_jobs} at once)"
fi

if [[ $do_tests == 1 ]]; then
  begin "build-tsan (configure + build)"
  configure build-tsan "-fsanitize=thread -fno-omit-frame-pointer" \
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread" -DATTENTION_TSAN_ABSL_ANNOTATIONS=ON
  cmake --build build-tsan --parallel "$(nproc)" --target "${tsan_targets[@]}"
  end "build-tsan (configure + build)"

  begin "TSan tests"
  # Any report fails the binary (exit 66) but lets it finish, so that one run
  # shows every report.
  export TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 suppressions=$repo/tests/tsan/suppressions.txt"
  for run in "${tsan_runs[@]}"; do
    # shellcheck disable=SC2086  # The entries are words: binary and flags.
    run_test build-tsan $run
  done
  end "TSan tests"
fi

# The timings, then the verdict as the last line.
trap - EXIT
summary
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "== sanitize: FAILED: ${failed[*]}"
  echo "sanitize: $((runs - ${#failed[@]})) passed, ${#failed[@]} failed"
  exit 1
fi
echo "sanitize: ${runs} passed, 0 failed"
