// File: core/session_attention.h
//
// The attention phase of a batch of session steps: each query row (one
// token of one session, all heads) against its session's cached keys and
// values. Rows that need no weights run the AVX-512 decode kernel
// (session_decode.h) when the CPU and the head dim allow: one task per
// (row, key split), each reading its keys' blocks front to back for all
// heads, then a merge of the splits' partials per row and head. A long cache
// is split (flash-decoding's split-K) when the batch holds too few rows to
// keep every thread busy. Other rows (and every row with the reference kernel
// chosen) run AttendSessionRow per head, as before.
//
// Semantics are AttendSessionRow's (session_kernel.h): within float rounding
// for ordinary rows (the decode kernel's base-2 exponential is within 2e-7
// of exp); heads whose scores hold a NaN or +inf, or see no key, are
// recomputed by the reference kernel, so they match it exactly.
//
// AttendRows runs OpenMP over its tasks; call it from one thread at a time
// per set of rows (distinct rows' outputs). Scratch comes from the calling
// thread's Workspace (slot kStepPartials).
#ifndef ATTENTION_CORE_SESSION_ATTENTION_H_
#define ATTENTION_CORE_SESSION_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "core/kv_cache.h"

namespace attention {

enum class SessionKernel {
  kAuto,       // The decode kernel where it applies, unless ATTENTION_SESSION_DECODE=0.
  kReference,  // AttendSessionRow for every row and head.
  kDecode,     // The decode kernel where it applies (what kAuto picks by default).
};

// One query row, all heads.
struct AttentionRow {
  const KvCache* cache = nullptr;
  int64_t keys = 0;          // Stored tokens the row sees: [0, keys).
  int64_t stored = 0;        // Stored tokens its weights rows span (>= keys).
  const float* q = nullptr;  // heads x head_dim, with the 1/sqrt(head_dim) scale.
  float* context = nullptr;  // heads x head_dim outputs.
  float* weights = nullptr;  // Optional: head h's row at weights + h * weights_head_stride.
  int64_t weights_head_stride = 0;
};

// The model's extra keys (add_bias_kv's projected key and value, heads x
// head_dim each, or null; add_zero_attn's zero key).
struct AttentionExtras {
  const float* bias_k = nullptr;
  const float* bias_v = nullptr;
  bool zero_attn = false;
};

void AttendRows(const std::vector<AttentionRow>& rows, const AttentionExtras& extras,
                SessionKernel kernel = SessionKernel::kAuto);

// Key splits of a row of `keys` keys in a batch of `rows` decode rows on
// `threads` threads: 1 unless rows < 4 x threads, and never below 8 blocks
// a split. rows x splits <= rows + kMaxSplitTasks.
inline constexpr int64_t kMaxSplitTasks = 64;
int64_t DecodeSplits(int64_t keys, int64_t rows, int threads);

// Bytes of the decode partials a batch of `rows` rows may use (an upper
// bound for any split counts DecodeSplits gives; per step, `rows` its
// tokens: steps add up).
int64_t DecodePartialBytes(int64_t rows, int64_t heads, int64_t head_dim);

// Combines `splits` partials (split s's head h at partials + (s * heads + h)
// * DecodePartialStride(head_dim)) with the extra keys into head `head`'s
// context; falls back to AttendSessionRow for the head when a partial is
// marked bad, an extra key's score is NaN or +inf, or no key is attendable.
void MergeDecodePartials(const float* partials, int64_t splits, const AttentionRow& row,
                         int64_t head, const AttentionExtras& extras);

}  // namespace attention

#endif  // ATTENTION_CORE_SESSION_ATTENTION_H_
