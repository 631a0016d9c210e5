// File: server/frontends/grpc/async_infer_call.h
//
// One attention.v1 Infer call on gRPC's async API, driven by its
// AsyncInferQueue (through AsyncInferDriver): posted to gRPC (waiting for a call), then received,
// decoded and submitted through the request path exactly as every unary
// front-end does (readiness, token, model, validation, admission, the
// batcher), answered, and freed once gRPC is done with it. It holds the
// call's admission until then, so that a response the client never reads
// stays inside the in-flight budget.
//
// Every step runs on the queue's thread except OnOutcome(), which runs on a
// batcher thread: it encodes the response and hands the call back to the
// queue, whose thread finishes it with the rest of its batch. Owned by the
// queue's thread; deletes itself (Handle()) when gRPC has delivered its last
// event.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_CALL_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_CALL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "attention/v1/attention.grpc.pb.h"
#include "server/batching/pending_request.h"
#include "server/frontends/grpc/async_infer_driver.h"
#include "server/requests/call_context.h"
#include "server/requests/inflight_budget.h"

namespace attention::server {

struct ServedModel;

class AsyncInferCall final : public AdmissionHolder {
 public:
  // What a completion-queue tag stands for.
  enum class Event { kArrived, kFinished, kDone };
  struct Tag {
    AsyncInferCall* call;
    Event event;
  };

  // Posts a new call to gRPC on `queue`'s completion queue.
  static void Post(AsyncInferDriver* queue);

  // On the queue's thread: gRPC delivered `tag` (an event of this call) with
  // `ok`. May delete the call.
  static void Handle(Tag* tag, bool ok);

  // On the queue's thread, once the answer is known (at once for a refused
  // request, after OnOutcome() handed the call back for a submitted one):
  // counts the answer and sends it.
  void Finish();

  // AdmissionHolder: from the batcher thread, before OnOutcome().
  void Hold(std::shared_ptr<Admission> held) override { held_ = std::move(held); }

  AsyncInferCall(const AsyncInferCall&) = delete;
  AsyncInferCall& operator=(const AsyncInferCall&) = delete;

 private:
  explicit AsyncInferCall(AsyncInferDriver* queue);
  ~AsyncInferCall() override;

  // The call arrived: decode, check and submit it, or answer at once.
  void Start();
  // From the batcher thread: the computed (or dropped) outcome.
  void OnOutcome(RequestOutcome outcome);
  // Frees the request's bytes (Clear() would keep their capacity).
  void FreeRequest();
  // Deletes the call once gRPC has nothing more to deliver for it.
  void MaybeDelete();

  AsyncInferDriver* const queue_;
  grpc::ServerContext context_;
  v1::InferRequest request_;
  v1::InferResponse response_;
  grpc::ServerAsyncResponseWriter<v1::InferResponse> responder_{&context_};
  Tag arrived_{this, Event::kArrived};
  Tag finished_{this, Event::kFinished};
  Tag done_{this, Event::kDone};

  // Set when gRPC reports the call done while its request waits: polled by
  // the batcher (which then answers CANCELLED without computing it).
  std::atomic<bool> cancelled_{false};
  // Written by the thread that produced the answer (the queue's, or a
  // batcher's before it hands the call back), read by the queue's.
  absl::Status status_;
  // The model and the call's context (whose leases hold the model's
  // version): until Finish() has counted the answer.
  const ServedModel* model_ = nullptr;
  CallRef call_;
  absl::Time received_;
  std::shared_ptr<Admission> held_;
  // The queue's thread only.
  bool sent_ = false;         // Finish() handed to gRPC; kFinished will come.
  bool finish_seen_ = false;  // kFinished delivered.
  bool done_seen_ = false;    // kDone delivered.
  bool started_ = false;      // kArrived delivered with ok: kDone will come.
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_CALL_H_
