#include "server/frontends/grpc/async_infer_call.h"

#include <utility>

#include "proto/codec/status_codes.h"
#include "server/frontends/grpc/grpc_call.h"
#include "server/requests/identifiers.h"
#include "server/requests/request_path.h"

namespace attention::server {

AsyncInferCall::AsyncInferCall(AsyncInferDriver* queue) : queue_(queue) { queue_->Added(); }

AsyncInferCall::~AsyncInferCall() { queue_->Removed(); }

void AsyncInferCall::Post(AsyncInferDriver* queue) {
  auto* call = new AsyncInferCall(queue);
  // Before the call starts, as gRPC requires: kDone comes once it is over
  // (answered, or cancelled by the client, its deadline or the shutdown).
  call->context_.AsyncNotifyWhenDone(&call->done_);
  queue->RequestCall(&call->context_, &call->request_, &call->responder_, &call->arrived_);
}

void AsyncInferCall::Handle(Tag* tag, bool ok) {
  AsyncInferCall* call = tag->call;
  switch (tag->event) {
    case Event::kArrived:
      if (!ok) {  // The server is shutting down: the call never started.
        delete call;
        return;
      }
      call->started_ = true;
      if (call->queue_->posting()) Post(call->queue_);
      call->Start();
      break;
    case Event::kFinished:
      call->finish_seen_ = true;
      break;
    case Event::kDone:
      call->done_seen_ = true;
      // Safe now that kDone came; while the request waits, it tells the
      // batcher to drop it.
      call->cancelled_.store(call->context_.IsCancelled(), std::memory_order_relaxed);
      break;
  }
  call->MaybeDelete();
}

void AsyncInferCall::Start() {
  RequestPath* path = queue_->path();
  received_ = absl::Now();
  path->Received();
  call_ = CallOf(context_, Method::kInfer,
                 [this] { return cancelled_.load(std::memory_order_relaxed); });
  // Cut to what an answer echoes: a refused request's id is unchecked, and
  // the response lives until gRPC is done with the call.
  response_.set_request_id(Echoed(request_.request_id()));
  RequestPath::Prepared prepared;
  absl::Status status = queue_->Prepare(request_, *call_, &prepared);
  model_ = prepared.model;
  if (status.ok()) {
    prepared.pending->flush = queue_;
    status = path->Submit(
        prepared, static_cast<int64_t>(request_.ByteSizeLong()),
        [this](RequestOutcome outcome) { OnOutcome(std::move(outcome)); }, this);
    if (status.ok()) return;  // The batcher answers (OnOutcome).
  }
  status_ = std::move(status);
  FreeRequest();
  Finish();
}

void AsyncInferCall::OnOutcome(RequestOutcome outcome) {
  absl::Status result = outcome.status;
  if (result.ok()) {
    result = queue_->Encode(outcome, &response_);
    response_.set_model_version(model_->version);
  }
  status_ = std::move(result);
  // Computed: its tensors are needed no more (the batch copied them), so
  // they go now rather than when gRPC is done with the call.
  FreeRequest();
  queue_->Complete(this);
}

void AsyncInferCall::Finish() {
  queue_->path()->Answered(model_, *call_, status_, received_);
  // Counted: the model version the call's lookup leased goes now, as it went
  // with the batch on the callback path. A client slow to read its response
  // holds the call (and its admission) open, but must not keep an unloaded
  // version resident (nor refuse a reload under --max_model_bytes).
  call_.reset();
  model_ = nullptr;
  sent_ = true;
  if (status_.ok()) {
    responder_.Finish(response_, grpc::Status::OK, &finished_);
  } else {
    responder_.FinishWithError(wire::ToGrpcStatus(status_), &finished_);
  }
  // gRPC serialized it: the message's bytes go now, not when the call ends.
  v1::InferResponse().Swap(&response_);
}

void AsyncInferCall::FreeRequest() { v1::InferRequest().Swap(&request_); }

void AsyncInferCall::MaybeDelete() {
  if (started_ && sent_ && finish_seen_ && done_seen_) delete this;
}

}  // namespace attention::server
