// File: core/session_kernel.h
//
// The attention of one query row of one head against a session's cached
// keys and values (KvCache's block layout): scores, softmax with the keys'
// additive biases, and the weighted sum of values. The loops run over
// contiguous kBlockTokens-wide key columns and head_dim-wide value rows; the
// function is compiled for AVX-512 and for baseline x86-64 and picks one at
// load time. It is the reference kernel: decode steps normally run the
// AVX-512 decode kernel (session_decode.h, all heads of a row in one pass),
// which hands this one the rows it does not take (weights asked for, head
// dims it does not support, no AVX-512) and its edge rows (NaN scores, no
// attendable key), so that their semantics are exactly these.
//
// Semantics are the stateless engine's for the keys the row sees (keys are
// stored with their additive mask, -inf for "not a key"): a row whose scores
// are all -inf gets zero weights and context 0 * V; a NaN score (a NaN query,
// key or mask) makes the row's context and weights NaN, a NaN value its
// context, as in PyTorch. Keys after the row (causal) are not seen at all.
//
// Pure function of its arguments; safe from any thread.
#ifndef ATTENTION_CORE_SESSION_KERNEL_H_
#define ATTENTION_CORE_SESSION_KERNEL_H_

#include <cstdint>

#include "core/kv_cache.h"

namespace attention {

struct SessionRow {
  const KvCache* cache = nullptr;
  int64_t head = 0;
  int64_t keys = 0;               // Stored tokens this row may see: [0, keys).
  int64_t stored = 0;             // Stored tokens the weights row spans (>= keys).
  const float* q = nullptr;       // head_dim, with the 1/sqrt(head_dim) scale.
  const float* bias_k = nullptr;  // add_bias_kv's key and value for this head, or null.
  const float* bias_v = nullptr;
  bool zero_attn = false;    // add_zero_attn's key (score 0, value 0).
  float* context = nullptr;  // head_dim outputs.
  float* weights = nullptr;  // Optional: stored + extra probabilities.
};

void AttendSessionRow(const SessionRow& row);

}  // namespace attention

#endif  // ATTENTION_CORE_SESSION_KERNEL_H_
