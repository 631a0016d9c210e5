// File: tests/model_lifecycle/churn/churn_wire.h
//
// The churn test's small wire helpers (deadlines, random queries, the
// inference protocol's requests and outputs), shared by churn_calls.cc and
// churn_calls_sessions.cc. Stateless.
#ifndef ATTENTION_TESTS_MODEL_LIFECYCLE_CHURN_CHURN_WIRE_H_
#define ATTENTION_TESTS_MODEL_LIFECYCLE_CHURN_CHURN_WIRE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>

#include "core/tensor.h"
#include "inference/grpc_predict_v2.pb.h"
#include "tests/fixture/model_versions_fixture.h"
#include "tests/fixture/test_util.h"

namespace attention::churn_test {

inline constexpr int64_t kE = model_versions_test::kE;
inline constexpr double kTolerance = 1e-4;

inline void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
}

// A (1, L, E) query of 1 to 4 random rows.
inline Tensor Query(std::mt19937& rng) {
  return testing::RandomTensor({1, static_cast<int64_t>(1 + rng() % 4), kE}, rng);
}

// The inference protocol's request of `query` (1, T, E) to model "m".
using model_versions_test::OipRequest;

// The first output of an inference-protocol response, and its version.
inline Tensor OipOutput(const inference::ModelInferResponse& response, const Shape& shape) {
  if (response.raw_output_contents_size() != 1 ||
      response.raw_output_contents(0).size() != static_cast<size_t>(NumElements(shape) * 4)) {
    return Tensor(DType::kFloat32, {0});
  }
  return Tensor::FromBytes(DType::kFloat32, shape, response.raw_output_contents(0).data());
}

inline int64_t VersionOf(const std::string& version) {
  return version.empty() ? -1 : std::strtoll(version.c_str(), nullptr, 10);
}

// Rows [at, at + n) of `x` (1, T, E) as (1, n, E).
inline Tensor Rows(const Tensor& x, int64_t at, int64_t n) {
  return Tensor::FromBytes(DType::kFloat32, {1, n, kE},
                           static_cast<const char*>(x.data()) + at * kE * 4);
}

}  // namespace attention::churn_test

#endif  // ATTENTION_TESTS_MODEL_LIFECYCLE_CHURN_CHURN_WIRE_H_
