#include "server/frontends/grpc/async_unary_call.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/codec/status_codes.h"
#include "server/frontends/grpc/grpc_call.h"
#include "server/requests/request_path.h"

namespace attention::server {

AsyncUnaryCall::AsyncUnaryCall(AsyncInferDriver* queue, Method method)
    : queue_(queue), method_(method) {
  queue_->Added();
}

AsyncUnaryCall::~AsyncUnaryCall() { queue_->Removed(); }

void AsyncUnaryCall::Post(AsyncUnaryCall* call) {
  // Before the call starts, as gRPC requires: kDone comes once it is over
  // (answered, or cancelled by the client, its deadline or the shutdown).
  call->context_.AsyncNotifyWhenDone(&call->done_);
  call->RequestCall();
}

void AsyncUnaryCall::Handle(Tag* tag, bool ok) {
  AsyncUnaryCall* call = tag->call;
  switch (tag->event) {
    case Event::kArrived:
      if (!ok) {  // The server is shutting down: the call never started.
        delete call;
        return;
      }
      call->started_ = true;
      if (call->queue_->posting()) call->PostAnother();
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

void AsyncUnaryCall::Start() {
  RequestPath* path = queue_->path();
  received_ = absl::Now();
  path->Received();
  call_ = CallOf(context_, method_, [this] { return cancelled_.load(std::memory_order_relaxed); });
  wire_bytes_ = static_cast<int64_t>(request_bytes_.Length());
  // The metadata first: a caller without a token costs no parse.
  absl::StatusOr<std::shared_ptr<const Principal>> caller = path->Gate(*call_);
  absl::Status status = caller.status();
  if (status.ok()) {
    caller_ = *std::move(caller);
    status = wire_bytes_ <= kInlineParseBytes ? Decode(nullptr) : ParseElsewhere();
    if (status.ok()) return;  // The method (Answer) or the parse pool answers.
  }
  status_ = std::move(status);
  FreeRequest();
  Finish();
}

absl::Status AsyncUnaryCall::ParseElsewhere() {
  // While it waits, its bytes count as an accepted request's: what the pool
  // holds stays inside the in-flight budget.
  absl::StatusOr<std::shared_ptr<Admission>> waiting = queue_->path()->budget().Take(wire_bytes_);
  if (!waiting.ok()) return waiting.status();
  if (!queue_->Parse(wire_bytes_, [this, waiting = *std::move(waiting)]() mutable {
        DecodeOffThread(std::move(waiting));
      })) {
    return absl::UnavailableError("server is shutting down");
  }
  return absl::OkStatus();
}

void AsyncUnaryCall::DecodeOffThread(std::shared_ptr<Admission> waiting) {
  absl::Status status;
  // As the batcher checks queued work: the deadline first (gRPC also
  // cancels a call whose deadline passed).
  const absl::Time now = absl::Now();
  if (now >= call_->deadline) {
    status = absl::DeadlineExceededError(
        absl::StrCat("deadline passed after ", absl::ToInt64Microseconds(now - received_),
                     " us waiting to be decoded; the request was not computed"));
  } else if (cancelled_.load(std::memory_order_relaxed)) {
    status = absl::CancelledError("request was cancelled while waiting to be decoded");
  } else if (queue_->path()->draining()) {
    // As if it had arrived now (the model's batcher takes no new work once
    // the drain has begun): parsing it would be for nothing.
    status = absl::UnavailableError("server is shutting down");
  } else {
    status = Decode(std::move(waiting));
    if (status.ok()) return;  // Submitted: the call may already be gone.
  }
  waiting.reset();
  status_ = std::move(status);
  FreeRequest();
  // As a batcher hands back an answered call: the queue's thread finishes
  // (and may delete) it from Complete() on.
  AsyncInferDriver* queue = queue_;
  queue->Complete(this);
  queue->Flush();
}

void AsyncUnaryCall::Answer(absl::Status result, const google::protobuf::MessageLite& response) {
  if (result.ok()) {
    bool own_buffer = false;
    const grpc::Status serialized =
        grpc::SerializationTraits<google::protobuf::MessageLite>::Serialize(
            response, &response_bytes_, &own_buffer);
    if (!serialized.ok()) {
      result = absl::InternalError(
          absl::StrCat("serializing the response failed: ", serialized.error_message()));
    }
  }
  status_ = std::move(result);
  // Computed: its tensors are needed no more (the batch copied them), and
  // the response is serialized (or refused), so they go now rather than
  // when gRPC is done with the call.
  FreeRequest();
  queue_->Complete(this);
}

void AsyncUnaryCall::Finish() {
  queue_->path()->Answered(model_, *call_, status_, received_);
  // Counted: the model version the call's lookup leased goes now, as it went
  // with the batch on the callback path. A client slow to read its response
  // holds the call (and its admission) open, but must not keep an unloaded
  // version resident (nor refuse a reload under --max_model_bytes).
  call_.reset();
  caller_.reset();
  model_ = nullptr;
  sent_ = true;
  if (status_.ok()) {
    responder_.Finish(response_bytes_, grpc::Status::OK, &finished_);
  } else {
    responder_.FinishWithError(wire::ToGrpcStatus(status_, &context_), &finished_);
  }
  // gRPC holds its own reference to the serialized bytes.
  response_bytes_.Clear();
}

void AsyncUnaryCall::FreeRequest() {
  request_bytes_.Clear();
  FreeMessages();
}

void AsyncUnaryCall::MaybeDelete() {
  if (started_ && sent_ && finish_seen_ && done_seen_) delete this;
}

}  // namespace attention::server
