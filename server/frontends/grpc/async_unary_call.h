// File: server/frontends/grpc/async_unary_call.h
//
// AsyncUnaryCall: the life of one unary inference call on gRPC's async API,
// driven by its AsyncInferQueue (through AsyncInferDriver), whatever the
// method: attention.v1 Infer (AsyncInferCall) and the inference protocol's
// ModelInfer (AsyncModelInferCall) differ only in how they parse, submit
// and encode. A call is posted to gRPC (waiting for a client's call), then
// received as bytes and let in by the request path's gate (ready, not
// draining, a known token: the call's metadata only) before anything is
// parsed; then the method parses and submits it (Decode) on the queue's
// thread, or, for a request larger than kInlineParseBytes, on the queue's
// parse pool (its bytes held in the in-flight budget meanwhile), so that no
// call waits behind another caller's large message; it is answered, and
// freed once gRPC is done with it. It holds the call's admission until
// then, so that a response the client never reads stays inside the
// in-flight budget. Start() counts every call received, Finish() every
// call answered (RequestPath::Received, Answered).
//
// Every step runs on the queue's thread but two: Decode on a parse thread
// for a large request (which hands a refused call back to the queue as a
// batcher does), and the method's answer on the thread that produced it (a
// batcher's, most often): Answer() serializes the response there and hands
// the call back to the queue, whose thread finishes it with the rest of its
// batch. Owned by the queue's thread; deletes itself (Handle()) when gRPC
// has delivered its last event, which cannot happen before it is handed
// back.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_UNARY_CALL_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_UNARY_CALL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "google/protobuf/message_lite.h"
#include "server/frontends/grpc/async_infer_driver.h"
#include "server/requests/call_context.h"
#include "server/requests/inflight_budget.h"

namespace attention::server {

struct ServedModel;

class AsyncUnaryCall : public AdmissionHolder {
 public:
  // What a completion-queue tag stands for.
  enum class Event { kArrived, kFinished, kDone };
  struct Tag {
    AsyncUnaryCall* call;
    Event event;
  };

  // Requests of at most this many bytes are parsed on the queue's thread
  // (which takes microseconds); larger ones on its parse pool.
  static constexpr int64_t kInlineParseBytes = 256 << 10;

  // On the queue's thread: gRPC delivered `tag` (an event of this call) with
  // `ok`. May delete the call.
  static void Handle(Tag* tag, bool ok);

  // On the queue's thread, once the answer is known (at once for a refused
  // request, after Answer() handed the call back for a submitted one):
  // counts the answer and sends it.
  void Finish();

  // AdmissionHolder: from the batcher thread, before the answer.
  void Hold(std::shared_ptr<Admission> held) override { held_ = std::move(held); }

  AsyncUnaryCall(const AsyncUnaryCall&) = delete;
  AsyncUnaryCall& operator=(const AsyncUnaryCall&) = delete;

 protected:
  AsyncUnaryCall(AsyncInferDriver* queue, Method method);
  ~AsyncUnaryCall() override;

  // Posts `call` (just made) to gRPC on its queue's completion queue.
  static void Post(AsyncUnaryCall* call);

  // The method's part. On the queue's thread: asks gRPC for the next call of
  // this method (RequestCall), and posts a new call of this kind.
  virtual void RequestCall() = 0;
  virtual void PostAnother() = 0;
  // Parses request_bytes_ (freeing them, and `waiting`), then decodes,
  // checks and submits the request, setting model_ once it is found. OK:
  // submitted, the method calls Answer() later (and the caller must not
  // touch the call again); else the error to answer with. On the queue's
  // thread or a parse thread.
  virtual absl::Status Decode(std::shared_ptr<Admission> waiting) = 0;
  // Frees the parsed request and the response message (Clear() would keep
  // their capacity).
  virtual void FreeMessages() = 0;

  // For the method, from the thread that has its answer (a batcher's): with
  // `result` OK, serializes `response` (here rather than on the queue's
  // thread, where a large response would hold every other call's answer);
  // then frees the request and hands the call back to the queue.
  void Answer(absl::Status result, const google::protobuf::MessageLite& response);

  AsyncInferDriver* const queue_;
  grpc::ServerContext context_;
  // The request as received, until parsed.
  grpc::ByteBuffer request_bytes_;
  // The request's size on the wire, its authenticated caller (null without
  // authentication) and its context (whose leases hold the model's version):
  // written by the queue's thread before the call goes to a parse thread.
  int64_t wire_bytes_ = 0;
  std::shared_ptr<const Principal> caller_;
  CallRef call_;
  // The model, once found: it counts the answer, a refusal too. Written by
  // Decode's thread, read by the queue's in Finish().
  const ServedModel* model_ = nullptr;
  // What RequestCall() hands gRPC.
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> responder_{&context_};
  Tag arrived_{this, Event::kArrived};

 private:
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
  // Frees the request's bytes, raw and parsed, and the response message.
  void FreeRequest();
  // Deletes the call once gRPC has nothing more to deliver for it.
  void MaybeDelete();

  const Method method_;
  grpc::ByteBuffer response_bytes_;
  Tag finished_{this, Event::kFinished};
  Tag done_{this, Event::kDone};

  // Set when gRPC reports the call done while its request waits: polled by
  // the batcher (which then answers CANCELLED without computing it).
  std::atomic<bool> cancelled_{false};
  // Written by the thread that produced the answer (the queue's, or a
  // parse or batcher thread before it hands the call back), read by the
  // queue's.
  absl::Status status_;
  absl::Time received_;
  std::shared_ptr<Admission> held_;
  // The queue's thread only.
  bool sent_ = false;         // Finish() handed to gRPC; kFinished will come.
  bool finish_seen_ = false;  // kFinished delivered.
  bool done_seen_ = false;    // kDone delivered.
  bool started_ = false;      // kArrived delivered with ok: kDone will come.
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_UNARY_CALL_H_
