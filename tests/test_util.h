// File: tests/test_util.h
//
// Shared test helpers: a StatusIs matcher (Debian's Abseil has none), a
// naive double-precision reference of torch.nn.MultiheadAttention's
// inference (the oracle for randomised tests), and random tensors.
#ifndef ATTENTION_TESTS_TEST_UTIL_H_
#define ATTENTION_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/mha_engine.h"
#include "core/mha_model.h"
#include "core/tensor.h"
#include "gmock/gmock.h"

namespace attention::testing {

inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

// Matches an absl::Status or absl::StatusOr<T> whose code is `code` and whose
// message matches `message_matcher`.
MATCHER_P2(StatusIs, code, message_matcher, "") {
  const absl::Status& status = StatusOf(arg);
  *result_listener << "status is " << status;
  return status.code() == code &&
         ::testing::Matches(message_matcher)(std::string(status.message()));
}

// A layer spec with kdim == vdim == embed_dim == e and h heads (float32).
inline MhaSpec SelfAttentionSpec(int64_t e, int64_t h) {
  MhaSpec s;
  s.embed_dim = s.kdim = s.vdim = e;
  s.num_heads = h;
  return s;
}

// The reference result: output (N, L, E) and per-head weights (N, H, L, S'),
// both as doubles, computed with plain loops.
struct Reference {
  std::vector<double> output;
  std::vector<double> weights;
};

// Runs `inputs` through `model` with the documented semantics (PyTorch 2.x
// masks, fully masked rows -> zero weights). Inputs must be valid.
Reference ReferenceMha(const MhaModel& model, const MhaInputs& inputs);

// A float32 tensor of normal(0, scale) values from `rng`.
Tensor RandomTensor(Shape shape, std::mt19937& rng, float scale = 1.0f);

// A bool tensor with P(true) = p.
Tensor RandomMask(Shape shape, std::mt19937& rng, double p);

// Writes `model` as a model directory (config.json with `extra_config`
// merged in, and model.safetensors with PyTorch's state_dict names).
void WriteModelDir(const MhaModel& model, const std::string& dir,
                   const std::string& extra_config = "");

// Largest |a - b| - rtol * |b| over the elements (<= atol passes).
double MaxExcess(const float* actual, const std::vector<double>& expected, double rtol);

}  // namespace attention::testing

#endif  // ATTENTION_TESTS_TEST_UTIL_H_
