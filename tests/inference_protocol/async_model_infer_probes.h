// File: tests/inference_protocol/async_model_infer_probes.h
//
// Helpers of the review probes of ModelInfer on gRPC's async API
// (async_model_infer_lifecycle_test, async_model_infer_semantics_test): a
// request of one FP32 query, a sequence step's parameters, a blocking call
// with a deadline, a call started on the callback stub (PendingModelInfer),
// and the fixture (its own small server, the inference protocol's stub and
// the model's ModelInfer answers by code). Header-only; each helper is
// thread-compatible, the server and stubs are the test's.
#ifndef ATTENTION_TESTS_INFERENCE_PROTOCOL_ASYNC_MODEL_INFER_PROBES_H_
#define ATTENTION_TESTS_INFERENCE_PROTOCOL_ASYNC_MODEL_INFER_PROBES_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/attention_server.h"
#include "server/frontends/protocol/oip_codec.h"
#include "tests/fixture/async_infer_test_util.h"

namespace attention::oip_async_probes {

using inference::GRPCInferenceService;
using inference::ModelInferRequest;
using inference::ModelInferResponse;
using server::Method;

inline ModelInferRequest Request(const Tensor& query, const std::string& id) {
  ModelInferRequest r;
  r.set_model_name("small");
  r.set_id(id);
  auto* input = r.add_inputs();
  input->set_name("query");
  input->set_datatype(server::OipDatatype(query.dtype()));
  input->mutable_shape()->Assign(query.shape().begin(), query.shape().end());
  r.add_raw_input_contents(std::string(static_cast<const char*>(query.data()), query.num_bytes()));
  return r;
}

inline void Step(ModelInferRequest* r, uint64_t sequence, bool start, bool end) {
  (*r->mutable_parameters())["sequence_id"].set_uint64_param(sequence);
  if (start) (*r->mutable_parameters())["sequence_start"].set_bool_param(true);
  if (end) (*r->mutable_parameters())["sequence_end"].set_bool_param(true);
}

inline grpc::Status Call(GRPCInferenceService::Stub* stub, const ModelInferRequest& request,
                         ModelInferResponse* response, grpc::ClientContext* context = nullptr) {
  grpc::ClientContext own;
  if (context == nullptr) context = &own;
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return stub->ModelInfer(context, request, response);
}

// A ModelInfer started on the callback stub; `done` is notified.
struct PendingModelInfer {
  explicit PendingModelInfer(ModelInferRequest r) : request(std::move(r)) {}
  grpc::ClientContext context;
  ModelInferRequest request;
  ModelInferResponse response;
  grpc::Status status;
  absl::Notification done;
  void Start(GRPCInferenceService::Stub* stub) {
    stub->async()->ModelInfer(&context, &request, &response, [this](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
  }
};

class AsyncModelInferProbeTest : public async_infer_testing::AsyncInferServerTest {
 protected:
  bool Start(const server::ServerOptions& options) {
    if (!async_infer_testing::AsyncInferServerTest::Start(options)) return false;
    oip_ = GRPCInferenceService::NewStub(channel_);
    return true;
  }
  double Answered(absl::StatusCode code) {
    return server_->repository()
        ->Find("small")
        ->metrics->requests[static_cast<int>(Method::kModelInfer)][static_cast<int>(code)]
        ->Value();
  }
  std::unique_ptr<GRPCInferenceService::Stub> oip_;
};

}  // namespace attention::oip_async_probes

#endif  // ATTENTION_TESTS_INFERENCE_PROTOCOL_ASYNC_MODEL_INFER_PROBES_H_
