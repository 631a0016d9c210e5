// File: server/frontends/grpc/async_model_infer_call.h
//
// One inference protocol ModelInfer call on gRPC's async API
// (AsyncUnaryCall's life): parsed as an inference.ModelInferRequest, then
// submitted through InferenceProtocol::Submit (by way of its driver,
// AsyncInferDriver::SubmitModelInfer), as the callback front-end's
// Infer and REST do (the model and the caller's access to it, stateless
// requests and sequence steps alike); its outcome encoded into an
// inference.ModelInferResponse by the protocol, on the batcher's thread.
//
// Thread-safety and ownership as AsyncUnaryCall's.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_MODEL_INFER_CALL_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_MODEL_INFER_CALL_H_

#include <memory>

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/frontends/grpc/async_unary_call.h"

namespace attention::server {

class AsyncModelInferCall final : public AsyncUnaryCall {
 public:
  // Posts a new call to gRPC on `queue`'s completion queue.
  static void Post(AsyncInferDriver* queue);

 private:
  explicit AsyncModelInferCall(AsyncInferDriver* queue)
      : AsyncUnaryCall(queue, Method::kModelInfer) {}

  // AsyncUnaryCall.
  void RequestCall() override;
  void PostAnother() override { Post(queue_); }
  absl::Status Decode(std::shared_ptr<Admission> waiting) override;
  void FreeMessages() override;

  inference::ModelInferRequest request_;
  // Filled by the protocol on the batcher thread, then serialized.
  inference::ModelInferResponse response_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_MODEL_INFER_CALL_H_
