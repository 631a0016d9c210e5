// File: tests/scale_out/replaying_sequence.h
//
// ReplayingSequence: an inference-protocol sequence on the demo model
// decoded as the README tells Triton clients to: the header
// x-attention-session carries the sequence id, each step says the length it
// expects, and a lost sequence (NOT_FOUND, UNAVAILABLE, or a diverged copy)
// is restarted under a new id with its history replayed. The gateway tests'
// client (gateway_test.cc). Not thread-safe (one decoding thread each);
// borrows the stub, which must outlive it. Header-only.
#ifndef ATTENTION_TESTS_SCALE_OUT_REPLAYING_SEQUENCE_H_
#define ATTENTION_TESTS_SCALE_OUT_REPLAYING_SEQUENCE_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "client/cli/client_util.h"
#include "core/tensor.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "proto/codec/routing_key.h"
#include "tests/fixture/oip_requests.h"
#include "tests/scale_out/gateway_test_util.h"

namespace attention::gateway_test {

class ReplayingSequence {
 public:
  explicit ReplayingSequence(inference::GRPCInferenceService::Stub* stub) : stub_(stub) {}

  absl::StatusOr<Tensor> Step(const Tensor& token) {
    absl::Status status;
    for (int attempt = 0; attempt <= 3; ++attempt) {
      if (lost_) {
        status = Restart();
        if (!status.ok()) {
          if (!Lost(status)) return status;
          continue;
        }
        if (!history_.empty()) ++recoveries_;  // The first start is none.
      }
      auto out = Send(token.as<float>(), 1);
      if (out.ok()) {
        history_.insert(history_.end(), token.as<float>(), token.as<float>() + kE);
        return Tensor::FromBytes(DType::kFloat32, {1, kE}, out->data());
      }
      status = out.status();
      if (!Lost(status)) return status;
      lost_ = true;
    }
    return status;
  }
  int recoveries() const { return recoveries_; }

 private:
  static bool Lost(const absl::Status& s) {
    return s.code() == absl::StatusCode::kNotFound || s.code() == absl::StatusCode::kUnavailable ||
           (s.code() == absl::StatusCode::kFailedPrecondition &&
            absl::StartsWith(s.message(), "expected_length:"));
  }

  // A new sequence id holding the history (replayed 256 tokens at a time).
  absl::Status Restart() {
    static std::atomic<uint64_t> counter{0};
    id_ = ((std::random_device()() * uint64_t{1000003}) ^ (++counter << 32)) | 1;
    length_ = 0;
    const int64_t rows = static_cast<int64_t>(history_.size()) / kE;
    for (int64_t at = 0; at < rows; at += 256) {
      auto out = Send(history_.data() + at * kE, std::min<int64_t>(256, rows - at));
      if (!out.ok()) return out.status();
    }
    lost_ = false;
    return absl::OkStatus();
  }

  // One step of `count` tokens; its output rows.
  absl::StatusOr<std::vector<float>> Send(const float* rows, int64_t count) {
    inference::ModelInferRequest r =
        testing::Fp32InferRequest("demo", "query", {1, count, kE}, rows);
    (*r.mutable_parameters())["sequence_id"].set_uint64_param(id_);
    if (length_ == 0) (*r.mutable_parameters())["sequence_start"].set_bool_param(true);
    (*r.mutable_parameters())["expected_length"].set_int64_param(length_);
    grpc::ClientContext context;
    client::SetDeadline(&context, 20000);
    context.AddMetadata(wire::kRoutingHeader, std::to_string(id_));
    inference::ModelInferResponse response;
    const grpc::Status status = stub_->ModelInfer(&context, r, &response);
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    }
    length_ += count;
    return testing::RawOutputFloats(response);
  }

  inference::GRPCInferenceService::Stub* const stub_;
  uint64_t id_ = 0;
  int64_t length_ = 0;
  bool lost_ = true;
  std::vector<float> history_;
  int recoveries_ = 0;
};

}  // namespace attention::gateway_test

#endif  // ATTENTION_TESTS_SCALE_OUT_REPLAYING_SEQUENCE_H_
