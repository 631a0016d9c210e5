#include "server/frontends/grpc/async_model_infer_call.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace attention::server {

void AsyncModelInferCall::Post(AsyncInferDriver* queue) {
  AsyncUnaryCall::Post(new AsyncModelInferCall(queue));
}

void AsyncModelInferCall::RequestCall() {
  queue_->RequestModelInfer(&context_, &request_bytes_, &responder_, &arrived_);
}

absl::Status AsyncModelInferCall::Decode(std::shared_ptr<Admission> waiting) {
  // Frees the bytes as it goes.
  const grpc::Status parsed = grpc::SerializationTraits<inference::ModelInferRequest>::Deserialize(
      &request_bytes_, &request_);
  // Parsed: the request's own admission (Submit) replaces the waiting one.
  waiting.reset();
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request: ", wire_bytes_, " bytes that do not parse as an inference.ModelInferRequest"));
  }
  return queue_->SubmitModelInfer(
      call_, request_, wire_bytes_, &response_, this,
      [this](const absl::Status& status) { Answer(status, response_); }, &model_);
}

void AsyncModelInferCall::FreeMessages() {
  inference::ModelInferRequest().Swap(&request_);
  inference::ModelInferResponse().Swap(&response_);
}

}  // namespace attention::server
