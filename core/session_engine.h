// File: core/session_engine.h
//
// SessionEngine computes attention for sessions that keep their projected
// keys and values in a KvCache, so that an autoregressive decoder sends each
// new token once instead of the whole prefix every step.
//
// A self-attention step appends T tokens x (T, E): their keys and values are
// stored, and token i of the chunk (position p = length + i) attends to every
// stored token up to p that is a key, plus add_bias_kv's and add_zero_attn's
// keys. Its output is exactly row p of
//   MultiheadAttention(X, X, X, key_padding_mask=not_key, attn_mask=causal)
// over the whole sequence X so far. A cross-attention session's keys and
// values are fixed at InitCross (an encoder's output, projected once); a
// step sends query tokens only.
//
// Every row is computed the same way however the sequence was chunked (the
// keys are stored before any row of the step is scored), so token-by-token,
// chunked and all-at-once appends agree to float rounding of the projections
// (and of the order in which a long cache's key splits are merged: how many
// splits a row gets depends on how many rows its batch holds).
// A row with no attendable key gets zero weights and a zero context, as the
// stateless engine does.
//
// Run() computes a batch of steps of different sessions together: the
// projections of all their tokens are one GEMM each, then attention runs per
// row over each session's own blocks (session_attention.h: OpenMP over rows,
// all heads at once, and over key splits of long caches when the batch is
// small).
//
// Thread safety: const methods may run concurrently on different caches; the
// caller serialises steps of one session. The engine is not owned and must
// outlive this. No exception escapes.
#ifndef ATTENTION_CORE_SESSION_ENGINE_H_
#define ATTENTION_CORE_SESSION_ENGINE_H_

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "core/kv_cache.h"
#include "core/mha_engine.h"
#include "core/session_attention.h"
#include "core/tensor.h"

namespace attention {

// One session's step in a batch.
struct SessionStep {
  KvCache* cache = nullptr;  // Reserved for the tokens (self sessions).
  bool cross = false;        // Query-only step against InitCross's keys.
  bool is_causal = false;    // Cross only: the query at position p sees keys <= p.
  int64_t position = 0;      // Cross only: query tokens appended before this step.
  TensorView tokens;         // (T, E), any float dtype.
  // Self only, (T) bool: true = stored but never attended to.
  std::optional<TensorView> not_key;
  bool need_weights = false;
  bool average_weights = true;  // (T, S') if true, else (H, T, S').
  float* output = nullptr;      // (T, E) float32.
  float* weights = nullptr;     // When need_weights.
};

// The fixed keys and values of a cross-attention session.
struct CrossKeys {
  TensorView key;                              // (S, kdim)
  TensorView value;                            // (S, vdim)
  std::optional<TensorView> key_padding_mask;  // (S): bool (true = ignore) or float (added).
};

class SessionEngine {
 public:
  // `cache_dtype`: float32, or bfloat16 (half the memory; approximate for a
  // float32 model). `kernel`: the attention kernel (session_attention.h).
  SessionEngine(const MhaEngine* engine, DType cache_dtype,
                SessionKernel kernel = SessionKernel::kAuto);

  SessionEngine(const SessionEngine&) = delete;
  SessionEngine& operator=(const SessionEngine&) = delete;

  DType cache_dtype() const { return cache_dtype_; }
  // A new, empty cache's block size in bytes.
  size_t block_bytes() const;
  const MhaSpec& spec() const { return engine_->model().spec(); }

  // OK when the model can hold self-attention sessions (kdim == vdim ==
  // embed_dim, as PyTorch requires for self-attention); else
  // InvalidArgument naming the model's kdim and vdim.
  absl::Status SupportsSelf() const;

  // InvalidArgument naming the tensor when the step's tokens are not a
  // (T, E) float tensor or `not_key` is not a (T) bool tensor (or is given
  // for a cross session), and for a self step when !SupportsSelf().
  absl::Status ValidateStep(bool cross, const TensorView& tokens,
                            const std::optional<TensorView>& not_key) const;
  absl::Status ValidateCross(const CrossKeys& keys) const;

  // Projects the fixed keys and values into the empty `cache`.
  // ResourceExhausted when its blocks cannot be had.
  absl::Status InitCross(const CrossKeys& keys, KvCache* cache) const;

  // Columns of a step's weights rows: the keys it can see after the step
  // (stored tokens, then the model's extra keys).
  int64_t WeightColumns(const SessionStep& step) const;

  // An upper bound on the bytes Run() allocates for a step of `tokens`
  // tokens whose weights rows have `columns` columns (WeightColumns), with
  // its weights averaged (a per-head copy is kept to average) or not. The
  // steps of a batch add up: a batch takes at most the sum of its steps'.
  // The caller's output and weights buffers are not included.
  int64_t StepWorkingBytes(int64_t tokens, int64_t columns, bool need_weights,
                           bool average_weights) const;
  // The same for InitCross() of `keys` keys.
  int64_t CrossWorkingBytes(int64_t keys) const;

  // Computes `steps` (of distinct sessions) together. With `commit`, the
  // self sessions' new tokens become part of them; without, the caller
  // commits each step it keeps (KvCache::Commit(length + T)) or drops it
  // (nothing to undo). On error no session changes.
  absl::Status Run(const std::vector<SessionStep>& steps, bool commit = true) const;

 private:
  const MhaEngine* const engine_;
  const DType cache_dtype_;
  const SessionKernel kernel_;
  std::vector<float> bias_k_, bias_v_;  // add_bias_kv's keys, projected space.
};

}  // namespace attention

#endif  // ATTENTION_CORE_SESSION_ENGINE_H_
