// File: server/frontends/grpc/stream_reactor.h
//
// The reactor of one bidirectional stream of requests (attention.v1
// InferStream and SessionStream): many requests in flight on one stream.
// Each request read is started on its own by the service's `start`
// function; completions (from batcher threads, in any order) queue their
// response for writing, one write at a time. A failed request's response
// carries its `error` and the stream goes on.
//
// Back-pressure: a request counts as pending from the moment it is read until
// its response is written (or dropped because the client went away). While
// the stream's pending requests reach ServiceOptions::max_stream_pending, or
// their bytes (request plus estimated response) max_stream_pending_bytes, the
// reactor stops reading; each completed write resumes reading once below both
// caps. A client that never reads its responses therefore holds a bounded
// amount of server memory and slows only itself. Across streams and unary
// calls, each request's bytes (and a refused request's error response) are
// also admitted against the service's in-flight budget until its response
// is written or dropped; while that budget is spent, a stream reads on only
// once it has nothing pending, so refusals cannot pile up either.
//
// Requests are started in the order they were read (the next read starts
// only after the previous request is queued), and a request is reported
// answered to the service (metrics and drain) when its response has been
// written, not when it was computed. Each request has its own CallContext
// (RequestOf), whose leases hold the versions it looked up until its
// response is computed (or it is refused): a response waiting for a client
// that does not read holds no version.
//
// The stream finishes once the client has half-closed, every request is
// answered and every response written. Owns itself: deleted in OnDone().
// Thread-safe: reactions and completions may run on any threads.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_STREAM_REACTOR_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_STREAM_REACTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/frontends/grpc/grpc_call.h"
#include "server/requests/call_context.h"
#include "server/requests/identifiers.h"
#include "server/requests/inflight_budget.h"
#include "server/requests/request_path.h"

namespace attention::server {

// How a stream's messages carry a request's id and a failed request's error.
// This primary template fits attention.v1 (request_id, error{code, message});
// other protocols specialize it.
template <typename Request, typename Response>
struct StreamCodec {
  static const std::string& Id(const Request& request) { return request.request_id(); }
  // Completes `response` (without id or error so far) with both.
  static void Complete(const std::string& id, const absl::Status& status, Response* response) {
    if (!status.ok()) {
      response->mutable_error()->set_code(static_cast<int>(status.code()));
      response->mutable_error()->set_message(std::string(Utf8Prefix(status.message(), 4096)));
    }
    response->set_request_id(Echoed(id));
  }
};

template <typename Request, typename Response>
class StreamReactor : public grpc::ServerBidiReactor<Request, Response> {
 public:
  // Called by a request's completion, exactly once: its response (without
  // request_id and error, which the reactor sets) and its status.
  using Reply = std::function<void(Response, const absl::Status&)>;
  // A request decoded and validated by the service.
  struct Prepared {
    absl::Status status;                 // Not OK: answer the request with it.
    const ServedModel* model = nullptr;  // Once known, for metrics.
    int64_t response_bytes = 0;          // The response's estimated size.
    // Queues the request: OK once queued (then `reply` will be called),
    // else the error to answer it with. `admission` holds the request's
    // bytes of the in-flight budget until its response is written; work
    // that learns its exact size only when it runs may grow it.
    std::function<absl::Status(Reply reply, Admission* admission)> submit;
  };
  // Decodes and validates `request`, which it may keep alive, for the
  // stream's call.
  using Start = std::function<Prepared(std::shared_ptr<Request> request, const CallContext& call)>;

  // `path` (for options, admission, counting and drain) must outlive the
  // reactor (the server waits for every call).
  StreamReactor(RequestPath* path, grpc::CallbackServerContext* context, Method method, Start start)
      : path_(path), call_(CallOf(context, method)), start_(std::move(start)) {
    {
      absl::MutexLock lock(&mu_);
      reading_ = true;
    }
    StartNextRead();
  }

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  // An error response's size at most (its message is cut to 4 KiB and its
  // echoed id to kMaxIdentifierBytes), admitted like any response.
  static constexpr int64_t kErrorResponseBytes = 4096 + 512 + kMaxIdentifierBytes;

  // A response waiting to be written, and what to report once it is.
  struct Outgoing {
    Response response;
    // The model answering (null: none found), as counted once written: its
    // version may be gone by then.
    const ModelMetrics* metrics = nullptr;
    std::string model;
    CallRef call;  // The request's own context (its leases let go of).
    absl::Status status;
    absl::Time received;
    int64_t charge = 0;               // Bytes counted against max_stream_pending_bytes.
    std::shared_ptr<Admission> held;  // Its bytes of the in-flight budget.
  };

  void StartNextRead() {
    incoming_ = std::make_unique<Request>();
    this->StartRead(incoming_.get());
  }
  // Queues the response to a request (of context `call`) charged `charge`
  // bytes, and lets go of the versions the request's leases hold (`model`
  // is not read after). `held` bytes of the service's in-flight budget are
  // released once the response is written or dropped.
  void Respond(Response response, const ServedModel* model, CallRef call,
               const absl::Status& status, absl::Time received, int64_t charge,
               std::shared_ptr<Admission> held);
  // True when another request may be read now.
  bool MayReadLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const ServiceOptions& o = path_->options();
    // While the server's in-flight budget is spent, a stream holds at most
    // one request: what it reads is refused, and refusals are admitted too.
    const bool budget_spent = path_->budget().used() >= path_->budget().limit();
    return !reads_done_ && !broken_ && pending_ < o.max_stream_pending &&
           pending_bytes_ < o.max_stream_pending_bytes && (pending_ == 0 || !budget_spent);
  }
  // True once (and only once) the stream is done: half-closed, every request
  // answered, every response written.
  bool ShouldFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reads_done_ && unanswered_ == 0 && !writing_ && !finished_) {
      finished_ = true;
      return true;
    }
    return false;
  }

  RequestPath* const path_;
  // The stream's call; each request read gets a copy with leases of its own
  // (RequestOf), shared with its work until its response is computed.
  const CallRef call_;
  const Start start_;
  std::unique_ptr<Request> incoming_;  // Only the reaction thread touches it.
  absl::Mutex mu_;
  std::deque<Outgoing> writes_ ABSL_GUARDED_BY(mu_);  // Front is being written.
  int64_t unanswered_ ABSL_GUARDED_BY(mu_) = 0;       // Read, not yet computed.
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;          // Read, response not yet written.
  int64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // A read is outstanding.
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

template <typename Request, typename Response>
void StreamReactor<Request, Response>::OnReadDone(bool ok) {
  if (!ok) {  // Half-close, cancellation or a broken stream.
    bool finish;
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      reads_done_ = true;
      finish = ShouldFinishLocked();
    }
    if (finish) this->Finish(grpc::Status::OK);
    return;
  }
  const absl::Time received = absl::Now();
  path_->Received();
  auto request = std::shared_ptr<Request>(incoming_.release());
  // Only the part an answer echoes is kept: a refused request's id is
  // unchecked, as large as its message, and held here, in the reply and in
  // the reply's std::function it would be three more copies of it.
  const std::string id = Echoed(StreamCodec<Request, Response>::Id(*request));
  const CallRef call = RequestOf(*call_);
  Prepared prepared = start_(request, *call);
  const int64_t request_bytes = static_cast<int64_t>(request->ByteSizeLong());
  InflightBudget& budget = path_->budget();
  std::shared_ptr<Admission> held;  // Of the server-wide in-flight byte budget.
  if (prepared.status.ok()) {
    auto taken = budget.Take(request_bytes + prepared.response_bytes);
    prepared.status = taken.status();
    if (taken.ok()) held = *std::move(taken);
  }
  if (!prepared.status.ok()) {
    // A refusal's response is admitted like any other (past the limit if
    // need be: the stream then stops reading while it has one pending).
    budget.Force(kErrorResponseBytes);
    held = std::make_shared<Admission>(&budget, kErrorResponseBytes);
  }
  const int64_t charge =
      request_bytes + (prepared.status.ok() ? prepared.response_bytes : kErrorResponseBytes);
  {
    absl::MutexLock lock(&mu_);
    ++unanswered_;
    ++pending_;
    pending_bytes_ += charge;
  }
  const ServedModel* model = prepared.model;
  Admission* admission = held.get();
  Reply reply = [this, id, received, model, call, charge, held](Response response,
                                                                const absl::Status& status) {
    // A failure (an oversized response included) is this request's own
    // error; the stream goes on.
    StreamCodec<Request, Response>::Complete(id, status, &response);
    Respond(std::move(response), model, call, status, received, charge, held);
  };
  held.reset();  // The reply holds it now.
  absl::Status status = prepared.status;
  if (status.ok()) status = prepared.submit(reply, admission);
  if (!status.ok()) reply(Response(), status);
  // The next read starts only after this request is queued, so a stream's
  // requests reach the queue in the order they were sent. `reading_` stays
  // true until here, so no write completion starts a read meanwhile.
  bool read_next, finish = false;
  {
    absl::MutexLock lock(&mu_);
    read_next = reading_ = MayReadLocked();
    // A write failed while this read was being handled (OnWriteDone saw a read
    // outstanding and left reads_done_ to it): no read will be started, so
    // reading is over here, and the stream may already be done. Without this
    // nothing would ever finish the stream: it held its call open forever and
    // Server::Shutdown (drain) waited for it.
    if (broken_ && !reading_) {
      reads_done_ = true;
      finish = ShouldFinishLocked();
    }
  }
  if (read_next) StartNextRead();
  if (finish) this->Finish(grpc::Status::OK);
}

template <typename Request, typename Response>
void StreamReactor<Request, Response>::Respond(Response response, const ServedModel* model,
                                               CallRef call, const absl::Status& status,
                                               absl::Time received, int64_t charge,
                                               std::shared_ptr<Admission> held) {
  RequestPath* const path = path_;  // `this` may be gone after Finish().
  // Computed (or refused): the versions it looked up may go now, and what
  // counting it needs of its model is kept apart.
  const ModelMetrics* const metrics = model != nullptr ? model->metrics : nullptr;
  std::string name = model != nullptr ? model->name : std::string();
  call->leases->Release();
  model = nullptr;
  const Response* write = nullptr;
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
      out.metrics = metrics;
      out.model = std::move(name);
      out.call = call;
      out.status = status;
      out.received = received;
      out.charge = charge;
      out.held = std::move(held);
      writes_.push_back(std::move(out));
      if (!writing_) {
        writing_ = true;
        write = &writes_.front().response;
      }
    }
    finish = ShouldFinishLocked();
  }
  // gRPC calls are made without the lock held.
  if (write != nullptr) this->StartWrite(write);
  if (dropped) {
    held.reset();
    path->Answered(metrics, name, *call, status, received);
  }
  if (finish) this->Finish(grpc::Status::OK);
}

template <typename Request, typename Response>
void StreamReactor<Request, Response>::OnWriteDone(bool ok) {
  std::vector<Outgoing> done;  // Written, or dropped because the stream broke.
  const Response* next = nullptr;
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
  RequestPath* const path = path_;
  for (Outgoing& o : done) {
    o.held.reset();
    path->Answered(o.metrics, o.model, *o.call, o.status, o.received);
  }
  if (next != nullptr) this->StartWrite(next);
  if (read_next) StartNextRead();
  if (finish) this->Finish(grpc::Status::OK);
}

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_STREAM_REACTOR_H_
