// File: tests/fuzz/session_oracle.h
//
// The session fuzzer's differential oracle: what a session holds (its
// committed tokens and not_key flags, or a cross session's fixed keys and
// the queries it answered), and the check of one step's rows against the
// stateless MhaEngine::Forward over the whole sequence so far: for a self
// session, the causal forward of every token so far with key_padding_mask =
// not_key; for a cross session, the forward of every query so far over its
// keys (is_causal as the session's). See session_fuzz.cc for the tolerance.
//
// Thread-compatible; SessionHistory owns its tensors.
#ifndef ATTENTION_TESTS_FUZZ_SESSION_ORACLE_H_
#define ATTENTION_TESTS_FUZZ_SESSION_ORACLE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "core/mha_engine.h"
#include "core/tensor.h"

namespace attention::fuzz {

struct SessionHistory {
  bool cross = false;
  bool is_causal = false;                  // Cross only (self sessions are causal).
  std::vector<float> rows;                 // Kept tokens (self) or queries (cross), (length, E).
  std::vector<uint8_t> not_key;            // Self: one flag per kept token.
  bool masked = false;                     // Self: some step sent not_key.
  Tensor key, value;                       // Cross: (S, kdim), (S, vdim).
  std::optional<Tensor> key_padding_mask;  // Cross: (S).

  int64_t length() const { return length_; }
  // Keeps a step's `t` tokens (`flags` empty: none is not_key).
  void Append(const std::vector<float>& step_rows, const std::vector<uint8_t>& flags, int64_t t);

 private:
  int64_t length_ = 0;
};

// One computed step of a session whose history does not include it yet.
struct StepResult {
  const std::vector<float>& rows;     // (t, E) float32.
  const std::vector<uint8_t>& flags;  // not_key, empty when not sent.
  bool need_weights = false;
  bool average_weights = true;
  const float* output = nullptr;   // (t, E).
  const float* weights = nullptr;  // (t, S') or (H, t, S') when need_weights.
};

// OK when every row of `step` (and its weights) matches the stateless
// forward within the tolerance for `cache_dtype` and the model's compute
// dtype; else INTERNAL "fuzz invariant: ..." naming the row, the column and
// both values.
absl::Status CheckStep(const MhaEngine& engine, DType cache_dtype, const SessionHistory& history,
                       const StepResult& step);

// OK when `status` is a refusal with code `expected` and a message; else
// INTERNAL "fuzz invariant: ..." (an unexpected code is passed on as it is).
absl::Status CheckRefusal(const absl::Status& status, absl::StatusCode expected);

}  // namespace attention::fuzz

#endif  // ATTENTION_TESTS_FUZZ_SESSION_ORACLE_H_
