// File: server/frontends/grpc/async_infer_queue.h
//
// AsyncInferQueue: the unary inference methods, attention.v1 Infer and the
// inference protocol's ModelInfer, on gRPC's async API, with one thread
// (`infer-cq`) driving one completion queue. The thread receives calls
// (AsyncInferCall, AsyncModelInferCall: the gate, decode, admission, the
// batcher, as every unary front-end) as bytes, and checks their metadata (readiness, drain, token)
// before it parses anything; it parses small requests itself and hands
// large ones to its ParsePool (`infer-parse`), so that no call waits behind
// another caller's large message. It sends their responses (serialized by
// the batcher's thread): a batcher hands each computed call back with
// Complete() (as does a parse thread a refused call), and the
// whole batch with one Flush(), which wakes the thread once (a grpc::Alarm);
// the thread then finishes every call of the batch and reaps their
// completions without sleeping in between. gRPC's callback API, by contrast,
// wakes one of its threads for every call's completion, and on a busy core
// each of those wake-ups preempts the batcher.
//
// Lifecycle: make it (with the builder's completion queue) before the server
// starts, Start() once it has, Stop() after the server's Shutdown(): Stop()
// waits for the calls still open (a batcher answers those it holds, the
// parse pool those it holds: the shutdown cancelled them), then shuts the
// completion queue down, drains it, joins the thread and stops the pool.
// Nothing in it blocks but Stop().
//
// Thread-safe. The services, the protocol, the request path and the
// completion queue's server must outlive it; it must outlive every batcher that holds its calls'
// requests (requests name it as their OutcomeFlush).
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_QUEUE_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_QUEUE_H_

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/batching/outcome_flush.h"
#include "server/frontends/grpc/async_infer_driver.h"
#include "server/frontends/grpc/parse_pool.h"

namespace attention::server {

class AttentionServiceImpl;
class InferenceProtocol;
class RequestPath;

class AsyncInferQueue final : public AsyncInferDriver {
 public:
  // Calls of each method posted to gRPC at any time, waiting for clients'
  // calls.
  static constexpr int kPostedCalls = 32;

  // `cq` from the builder (ServerBuilder::AddCompletionQueue()) that
  // registers `service` and `inference` (whose ModelInfer goes to
  // `protocol`); `parse_threads` (at least 1) parse large requests.
  // (InferenceServiceImpl is the `inference` the server passes: the
  // generated base keeps this file off the service's includes.)
  using RawModelInfer = inference::GRPCInferenceService::WithRawMethod_ModelInfer<
      inference::GRPCInferenceService::Service>;
  AsyncInferQueue(AttentionServiceImpl* service, RawModelInfer* inference,
                  InferenceProtocol* protocol, RequestPath* path,
                  std::unique_ptr<grpc::ServerCompletionQueue> cq, int parse_threads = 1);
  // Stop()s if needed.
  ~AsyncInferQueue() override;

  AsyncInferQueue(const AsyncInferQueue&) = delete;
  AsyncInferQueue& operator=(const AsyncInferQueue&) = delete;

  // Once the server has started: posts the calls and starts the thread.
  void Start();
  // After the server's Shutdown() (or if it never started): see above.
  void Stop();

  // AsyncInferDriver.
  void RequestInfer(grpc::ServerContext* context, grpc::ByteBuffer* request,
                    grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* responder,
                    void* tag) override;
  void RequestModelInfer(grpc::ServerContext* context, grpc::ByteBuffer* request,
                         grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* responder,
                         void* tag) override;
  absl::Status Prepare(const v1::InferRequest& request, const Principal* caller,
                       const CallContext& call, RequestPath::Prepared* prepared) override;
  bool Parse(int64_t bytes, absl::AnyInvocable<void() &&> task) override;
  absl::Status Encode(RequestOutcome& outcome, v1::InferResponse* response) override;
  void Complete(AsyncUnaryCall* call) override;
  RequestPath* path() const override { return path_; }
  absl::Status SubmitModelInfer(CallRef call, const inference::ModelInferRequest& request,
                                int64_t request_bytes, inference::ModelInferResponse* response,
                                AdmissionHolder* holder,
                                std::function<void(const absl::Status&)> done,
                                const ServedModel** model) override;
  // OutcomeFlush: wakes the thread to send the answers completed so far.
  void Flush() override;

  // The pool that parses large requests (for tests: its counters and hook).
  ParsePool& parse_pool() { return parse_pool_; }

 private:
  void Loop();
  // The alarm fired: send what is ready; start stopping when asked.
  void OnAlarm();
  // Arms the alarm unless it is armed or the queue is shut down, or (unless
  // `always`) nothing is ready.
  void Wake(bool always);
  // The queue's thread, stopping with no call left: shuts the queue down
  // unless the alarm is still to be delivered.
  void MaybeShutDown();

  AttentionServiceImpl* const service_;
  RawModelInfer* const inference_;
  InferenceProtocol* const protocol_;
  RequestPath* const path_;
  const std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  ParsePool parse_pool_;
  grpc::Alarm alarm_;
  char alarm_tag_ = 0;  // Its address tags the alarm.

  absl::Mutex mu_;
  std::vector<AsyncUnaryCall*> ready_ ABSL_GUARDED_BY(mu_);  // Answers to send.
  bool armed_ ABSL_GUARDED_BY(mu_) = false;                  // The alarm is set, not yet delivered.
  bool stop_asked_ ABSL_GUARDED_BY(mu_) = false;
  bool cq_shut_ ABSL_GUARDED_BY(mu_) = false;  // No alarm may be set any more.
  bool started_ = false;                       // Start()/Stop() only (one thread).
  bool stopped_ = false;

  // The queue's thread only (and stopping_, live_ of AsyncInferDriver).
  bool shut_down_ = false;

  std::thread thread_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_QUEUE_H_
