#include "server/frontends/grpc/async_infer_call.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/requests/identifiers.h"
#include "server/requests/request_path.h"

namespace attention::server {

void AsyncInferCall::Post(AsyncInferDriver* queue) {
  AsyncUnaryCall::Post(new AsyncInferCall(queue));
}

void AsyncInferCall::RequestCall() {
  queue_->RequestInfer(&context_, &request_bytes_, &responder_, &arrived_);
}

absl::Status AsyncInferCall::Decode(std::shared_ptr<Admission> waiting) {
  // Frees the bytes as it goes.
  const grpc::Status parsed =
      grpc::SerializationTraits<v1::InferRequest>::Deserialize(&request_bytes_, &request_);
  // Parsed: the request's own admission (Submit) replaces the waiting one.
  waiting.reset();
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request: ", wire_bytes_, " bytes that do not parse as an attention.v1.InferRequest"));
  }
  // Cut to what an answer echoes: a refused request's id is unchecked, and
  // the response lives until gRPC is done with the call.
  response_.set_request_id(Echoed(request_.request_id()));
  RequestPath::Prepared prepared;
  const absl::Status prepared_status = queue_->Prepare(request_, caller_.get(), *call_, &prepared);
  // Once found, the model counts the answer, a refusal too.
  model_ = prepared.model;
  RETURN_IF_ERROR(prepared_status);
  prepared.pending->flush = queue_;
  return queue_->path()->Submit(
      prepared, wire_bytes_, [this](RequestOutcome outcome) { OnOutcome(std::move(outcome)); },
      this);
}

void AsyncInferCall::OnOutcome(RequestOutcome outcome) {
  absl::Status result = outcome.status;
  if (result.ok()) {
    result = queue_->Encode(outcome, &response_);
    response_.set_model_version(model_->version);
  }
  Answer(std::move(result), response_);
}

void AsyncInferCall::FreeMessages() {
  v1::InferRequest().Swap(&request_);
  v1::InferResponse().Swap(&response_);
}

}  // namespace attention::server
