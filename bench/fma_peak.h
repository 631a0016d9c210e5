// File: bench/fma_peak.h
//
// The machine's float32 FMA peak, measured: every OpenMP thread runs a loop
// of AVX-512 FMAs over 12 independent accumulators (enough to hide the FMA
// latency), so the figure is what the cores can do, not what a library gets.
// Falls back to 0 where the CPU has no AVX-512.
#ifndef ATTENTION_BENCH_FMA_PEAK_H_
#define ATTENTION_BENCH_FMA_PEAK_H_

namespace attention {

// GFLOP/s of the FMA loop on the current OpenMP team (best of a few runs).
double FmaPeakGflops();

}  // namespace attention

#endif  // ATTENTION_BENCH_FMA_PEAK_H_
