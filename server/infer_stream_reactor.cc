#include "server/infer_stream_reactor.h"

#include <string>
#include <utility>
#include <vector>

namespace attention::server {
namespace {

// An error response's size, charged against the stream's byte cap.
constexpr int64_t kErrorResponseBytes = 256;

void SetError(const absl::Status& status, v1::InferResponse* response) {
  response->mutable_error()->set_code(static_cast<int>(status.code()));
  response->mutable_error()->set_message(std::string(status.message()));
}

}  // namespace

InferStreamReactor::InferStreamReactor(AttentionServiceImpl* service,
                                       grpc::CallbackServerContext* context)
    : service_(service), context_(context) {
  {
    absl::MutexLock lock(&mu_);
    reading_ = true;
  }
  StartNextRead();
}

void InferStreamReactor::StartNextRead() {
  incoming_ = std::make_unique<v1::InferRequest>();
  StartRead(incoming_.get());
}

bool InferStreamReactor::MayReadLocked() const {
  const ServiceOptions& o = service_->options();
  return !reads_done_ && !broken_ && pending_ < o.max_stream_pending &&
         pending_bytes_ < o.max_stream_pending_bytes;
}

bool InferStreamReactor::ShouldFinishLocked() {
  if (reads_done_ && unanswered_ == 0 && !writing_ && !finished_) {
    finished_ = true;
    return true;
  }
  return false;
}

void InferStreamReactor::OnReadDone(bool ok) {
  if (!ok) {  // Half-close, cancellation or a broken stream.
    bool finish;
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      reads_done_ = true;
      finish = ShouldFinishLocked();
    }
    if (finish) Finish(grpc::Status::OK);
    return;
  }
  const absl::Time received = absl::Now();
  service_->Received();
  auto request = std::shared_ptr<v1::InferRequest>(incoming_.release());
  AttentionServiceImpl::Prepared prepared;
  absl::Status status = service_->Prepare(*request, request, context_, &prepared);
  const int64_t charge = static_cast<int64_t>(request->ByteSizeLong()) +
                         (status.ok() ? prepared.response_bytes : kErrorResponseBytes);
  {
    absl::MutexLock lock(&mu_);
    ++unanswered_;
    ++pending_;
    pending_bytes_ += charge;
  }
  const ServedModel* model = prepared.model;
  const std::string id = request->request_id();
  if (status.ok()) {
    const int64_t max_bytes = service_->options().max_response_bytes;
    prepared.pending->done = [this, id, received, model, charge,
                              max_bytes](RequestOutcome outcome) {
      v1::InferResponse response;
      absl::Status result = outcome.status;
      if (result.ok()) result = EncodeOutcome(outcome, max_bytes, &response);
      // A failure (an oversized response included) is this request's own
      // error; the stream goes on.
      if (!result.ok()) SetError(result, &response);
      response.set_request_id(id);
      Respond(std::move(response), model, result.code(), received, charge);
    };
    status = model->batcher->Enqueue(std::move(prepared.pending));
  }
  if (!status.ok()) {
    v1::InferResponse response;
    response.set_request_id(id);
    SetError(status, &response);
    Respond(std::move(response), model, status.code(), received, charge);
  }
  // The next read starts only after this request is queued, so a stream's
  // requests reach the queue in the order they were sent. `reading_` stays
  // true until here, so no write completion starts a read meanwhile.
  bool read_next;
  {
    absl::MutexLock lock(&mu_);
    read_next = reading_ = MayReadLocked();
  }
  if (read_next) StartNextRead();
}

void InferStreamReactor::Respond(v1::InferResponse response, const ServedModel* model,
                                 absl::StatusCode code, absl::Time received, int64_t charge) {
  AttentionServiceImpl* const service = service_;  // `this` may be gone after Finish().
  const v1::InferResponse* write = nullptr;
  bool dropped = false, finish = false;
  {
    absl::MutexLock lock(&mu_);
    --unanswered_;
    if (broken_) {  // The client is gone: nothing to write it to.
      dropped = true;
      --pending_;
      pending_bytes_ -= charge;
    } else {
      Outgoing out;
      out.response = std::move(response);
      out.model = model;
      out.code = code;
      out.received = received;
      out.charge = charge;
      writes_.push_back(std::move(out));
      if (!writing_) {
        writing_ = true;
        write = &writes_.front().response;
      }
    }
    finish = ShouldFinishLocked();
  }
  // gRPC calls are made without the lock held.
  if (write != nullptr) StartWrite(write);
  if (dropped) service->Answered(model, Method::kInferStream, code, received);
  if (finish) Finish(grpc::Status::OK);
}

void InferStreamReactor::OnWriteDone(bool ok) {
  std::vector<Outgoing> done;  // Written, or dropped because the stream broke.
  const v1::InferResponse* next = nullptr;
  bool read_next = false, finish = false;
  {
    absl::MutexLock lock(&mu_);
    done.push_back(std::move(writes_.front()));
    writes_.pop_front();
    if (!ok) broken_ = true;  // The client is gone: drop what is left.
    if (broken_) {
      while (!writes_.empty()) {
        done.push_back(std::move(writes_.front()));
        writes_.pop_front();
      }
      // With no read outstanding none will complete: reading is over.
      if (!reading_) reads_done_ = true;
    }
    for (const Outgoing& o : done) {
      --pending_;
      pending_bytes_ -= o.charge;
    }
    if (!writes_.empty()) {
      next = &writes_.front().response;
    } else {
      writing_ = false;
    }
    if (!reading_ && MayReadLocked()) read_next = reading_ = true;
    finish = ShouldFinishLocked();
  }
  AttentionServiceImpl* const service = service_;
  for (const Outgoing& o : done) {
    service->Answered(o.model, Method::kInferStream, o.code, o.received);
  }
  if (next != nullptr) StartWrite(next);
  if (read_next) StartNextRead();
  if (finish) Finish(grpc::Status::OK);
}

}  // namespace attention::server
