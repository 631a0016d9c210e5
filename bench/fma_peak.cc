#include "bench/fma_peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>

namespace attention {
namespace {

// 12 chains x 16 lanes x 2 FLOPs per iteration.
float FmaLoop(int64_t iterations) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm512_add_ps(sum, acc[i]);
  alignas(64) float out[16];
  _mm512_store_ps(out, sum);
  return out[0];
}

}  // namespace

double FmaPeakGflops() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) return 0;
  constexpr int64_t kIterations = 20'000'000;
  double best = 0;
  volatile float sink = 0;
  for (int run = 0; run < 3; ++run) {
    int threads = 1;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
    {
#pragma omp single
      threads = omp_get_num_threads();
      const float r = FmaLoop(kIterations);
#pragma omp atomic
      sink += r;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, threads * kIterations * 12.0 * 16 * 2 / seconds / 1e9);
  }
  (void)sink;
  return best;
}

}  // namespace attention
