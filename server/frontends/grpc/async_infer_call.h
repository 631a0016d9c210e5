// File: server/frontends/grpc/async_infer_call.h
//
// One attention.v1 Infer call on gRPC's async API (AsyncUnaryCall's life):
// parsed as an attention.v1.InferRequest, decoded and submitted through the
// request path exactly as every unary front-end does (model, validation,
// admission, the batcher); its outcome encoded (OnOutcome, on the batcher's
// thread) as an attention.v1.InferResponse.
//
// Thread-safety and ownership as AsyncUnaryCall's.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_CALL_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_CALL_H_

#include <memory>

#include "attention/v1/attention.grpc.pb.h"
#include "server/batching/pending_request.h"
#include "server/frontends/grpc/async_unary_call.h"

namespace attention::server {

class AsyncInferCall final : public AsyncUnaryCall {
 public:
  // Posts a new call to gRPC on `queue`'s completion queue.
  static void Post(AsyncInferDriver* queue);

 private:
  explicit AsyncInferCall(AsyncInferDriver* queue) : AsyncUnaryCall(queue, Method::kInfer) {}

  // AsyncUnaryCall.
  void RequestCall() override;
  void PostAnother() override { Post(queue_); }
  absl::Status Decode(std::shared_ptr<Admission> waiting) override;
  void FreeMessages() override;

  // From the batcher thread: the computed (or dropped) outcome.
  void OnOutcome(RequestOutcome outcome);

  v1::InferRequest request_;
  // Built on the batcher thread, then serialized (AsyncUnaryCall::Answer).
  v1::InferResponse response_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_CALL_H_
