// File: core/session_decode.h
//
// The AVX-512 decode kernel of the session engine: one query token of one
// session against a range of its cached keys, every head at once, in one
// front-to-back pass over the cache blocks (each block's K^T and V planes of
// all heads are contiguous, so the pass is a sequential read, prefetched a
// few planes ahead). Scores, a base-2 online softmax with a lazily moved
// reference (as the fused kernel's ScoresExp) and P.V stay in registers; a
// bfloat16 cache is widened to float32 exactly. The result is a partial: per
// head the unnormalised context, the probabilities' sum and their reference,
// which MergeDecodePartials (session_attention.h) combines across ranges
// (split-K, as flash-decoding does) with the model's extra keys.
//
// AttendSessionRow (session_kernel.h) stays the reference: rows that need
// weights, head dims the kernel does not take (DecodeSupports), CPUs without
// AVX-512, and every head whose partial is marked bad (a NaN or +inf score)
// or whose keys are all masked are computed by it, so edge rows keep its
// semantics exactly.
//
// The .cc is compiled with AVX-512 flags (core/CMakeLists.txt): call
// DecodeRange only when DecodeSupports() is true, which checks the CPU (no
// ifunc, so ThreadSanitizer builds work). Pure functions; safe from any
// thread on distinct partials.
#ifndef ATTENTION_CORE_SESSION_DECODE_H_
#define ATTENTION_CORE_SESSION_DECODE_H_

#include <cstdint>

#include "core/kv_cache.h"

namespace attention {

// Floats of one head's partial: acc[head_dim] (unnormalised context),
// 16 lanes of the probabilities' sum, then the reference m (log2 units) and
// a bad flag (non-zero: fall back to the reference kernel), padded to 64
// bytes.
inline int64_t DecodePartialStride(int64_t head_dim) { return head_dim + 32; }
inline constexpr int64_t kDecodeSumAt = 0;  // Offsets after acc[head_dim].
inline constexpr int64_t kDecodeMaxAt = 16;
inline constexpr int64_t kDecodeBadAt = 17;

// Software prefetch: `planes` planes (one head's K^T and V of one block)
// ahead of the one being read, into L1 (hint 0), L2 (1) or non-temporally
// (2); 0 planes: none, the hardware prefetchers only. The default (16 planes
// into L2) measured best on the demo model (attention-session-bench
// --decode_prefetch). Get/Set (defined in session_attention.cc, baseline
// code, callable on any CPU) hold the setting AttendRows passes on: from
// ATTENTION_DECODE_PREFETCH and ATTENTION_DECODE_PREFETCH_HINT if set; Set
// changes it process-wide (for benchmarks; thread-safe, steps already
// running may use either).
struct DecodePrefetch {
  int64_t planes = 16;
  int hint = 1;
};
DecodePrefetch GetDecodePrefetch();
void SetDecodePrefetch(const DecodePrefetch& p);

struct DecodeRange {
  const KvCache* cache = nullptr;
  int64_t begin = 0;  // Keys [begin, end) of the cache; begin a multiple of kBlockTokens.
  int64_t end = 0;
  const float* q = nullptr;  // heads x head_dim, with the 1/sqrt(head_dim) scale.
  float* partial = nullptr;  // heads x DecodePartialStride(head_dim), 64-byte aligned.
  DecodePrefetch prefetch;
};

// True when the CPU has AVX-512 (F, BW, VL, DQ), the cache is float32 or
// bfloat16 and its head_dim a multiple of 16 up to 128.
bool DecodeSupports(const KvCache& cache);

// Writes r.partial for keys [r.begin, r.end) (an empty range gives m = -inf,
// zero sums and context).
void DecodeRangeAvx512(const DecodeRange& r);

}  // namespace attention

#endif  // ATTENTION_CORE_SESSION_DECODE_H_
