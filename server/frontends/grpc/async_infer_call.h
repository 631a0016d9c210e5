// File: server/frontends/grpc/async_infer_call.h
//
// One attention.v1 Infer call on gRPC's async API, driven by its
// AsyncInferQueue (through AsyncInferDriver): posted to gRPC (waiting for a
// call), then received as bytes, let in by the request path's gate (ready,
// not draining, a known token: the call's metadata only), parsed, decoded
// and submitted through the request path exactly as every unary front-end
// does (model, validation, admission, the batcher), answered, and freed once
// gRPC is done with it. It holds the call's admission until then, so that a
// response the client never reads stays inside the in-flight budget.
//
// Every step runs on the queue's thread but two. A request larger than
// kInlineParseBytes is parsed, decoded and submitted on a thread of the
// queue's parse pool (its bytes held in the in-flight budget meanwhile),
// which hands a refused call back to the queue as a batcher does. And
// OnOutcome() runs on a batcher thread: it encodes and serializes the
// response and hands the call back to the queue, whose thread finishes it
// with the rest of its batch. Owned by the queue's thread; deletes itself
// (Handle()) when gRPC has delivered its last event, which cannot happen
// before it is handed back.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_CALL_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_CALL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
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

  // Requests of at most this many bytes are parsed on the queue's thread
  // (which takes microseconds); larger ones on its parse pool.
  static constexpr int64_t kInlineParseBytes = 256 << 10;

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

  // The call arrived: check its metadata, then decode and submit it (or
  // hand it to the parse pool), or answer at once.
  void Start();
  // The queue's thread: posts the call to the parse pool, its bytes held in
  // the in-flight budget until parsed. OK: posted (the pool answers);
  // RESOURCE_EXHAUSTED over the budget, UNAVAILABLE when the pool stopped.
  absl::Status ParseElsewhere();
  // A parse thread: decodes and submits the call, unless it was cancelled,
  // its deadline passed or a drain began while it waited; hands a refusal
  // back.
  void DecodeOffThread(std::shared_ptr<Admission> waiting);
  // Parses request_bytes_ (and frees them, and `waiting`), decodes,
  // checks and submits the request. OK: submitted, the batcher answers
  // (and the caller must not touch the call again); else the error to
  // answer with. On the queue's thread or a parse thread.
  absl::Status Decode(std::shared_ptr<Admission> waiting);
  // From the batcher thread: the computed (or dropped) outcome.
  void OnOutcome(RequestOutcome outcome);
  // Frees the request's bytes, raw and parsed (Clear() would keep their
  // capacity).
  void FreeRequest();
  // Deletes the call once gRPC has nothing more to deliver for it.
  void MaybeDelete();

  AsyncInferDriver* const queue_;
  grpc::ServerContext context_;
  // The request as received (until parsed), and parsed.
  grpc::ByteBuffer request_bytes_;
  v1::InferRequest request_;
  // The response being built (on the batcher thread), then serialized.
  v1::InferResponse response_;
  grpc::ByteBuffer response_bytes_;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> responder_{&context_};
  Tag arrived_{this, Event::kArrived};
  Tag finished_{this, Event::kFinished};
  Tag done_{this, Event::kDone};

  // Set when gRPC reports the call done while its request waits: polled by
  // the batcher (which then answers CANCELLED without computing it).
  std::atomic<bool> cancelled_{false};
  // Written by the queue's thread before the call goes to a parse thread,
  // read there: the request's size on the wire and its authenticated
  // caller (null without authentication).
  int64_t wire_bytes_ = 0;
  std::shared_ptr<const Principal> caller_;
  // Written by the thread that produced the answer (the queue's, or a
  // parse or batcher thread before it hands the call back), read by the
  // queue's.
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
