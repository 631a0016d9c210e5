// File: server/frontends/grpc/async_infer_driver.h
//
// AsyncInferDriver: what an AsyncUnaryCall needs of the queue that drives
// it (AsyncInferQueue), so that a call knows neither the queue nor the
// services: asking gRPC for the next call of each method, attention.v1's
// decoding and encoding, the inference protocol's submission, the request
// path, the parse pool, and the hand-back of an answered call. An OutcomeFlush: the calls' requests
// name it to the batcher (and the parse pool's threads use it as a batcher does).
//
// Thread-safety as AsyncInferQueue documents each member.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_DRIVER_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_DRIVER_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "attention/v1/attention.grpc.pb.h"
#include "inference/grpc_predict_v2.pb.h"
#include "server/batching/outcome_flush.h"
#include "server/batching/pending_request.h"
#include "server/requests/call_context.h"
#include "server/requests/request_path.h"

namespace attention::server {

class AsyncUnaryCall;
struct ServedModel;

class AsyncInferDriver : public OutcomeFlush {
 public:
  // The driver's thread: asks gRPC for the next attention.v1 Infer call, or
  // the next inference protocol ModelInfer call (its request's bytes into
  // *request), delivered as `tag` on the driver's completion queue.
  virtual void RequestInfer(grpc::ServerContext* context, grpc::ByteBuffer* request,
                            grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* responder,
                            void* tag) = 0;
  virtual void RequestModelInfer(grpc::ServerContext* context, grpc::ByteBuffer* request,
                                 grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* responder,
                                 void* tag) = 0;
  // Any thread: the service's AttentionServiceImpl::PrepareGated.
  virtual absl::Status Prepare(const v1::InferRequest& request, const Principal* caller,
                               const CallContext& call, RequestPath::Prepared* prepared) = 0;
  // The driver's thread: runs `task` (counted as `bytes`) on the parse
  // pool. False when the pool has stopped (`task` dropped unrun).
  virtual bool Parse(int64_t bytes, absl::AnyInvocable<void() &&> task) = 0;
  // Any thread: fills `response` from `outcome` (EncodeOutcome, the
  // server's response limit).
  virtual absl::Status Encode(RequestOutcome& outcome, v1::InferResponse* response) = 0;
  // A batcher or parse thread: `call`'s answer is ready; it is sent after
  // the next Flush().
  virtual void Complete(AsyncUnaryCall* call) = 0;
  virtual RequestPath* path() const = 0;
  // Any thread: the inference protocol's InferenceProtocol::Submit, the
  // answers flushed to this driver.
  virtual absl::Status SubmitModelInfer(CallRef call, const inference::ModelInferRequest& request,
                                        int64_t request_bytes,
                                        inference::ModelInferResponse* response,
                                        AdmissionHolder* holder,
                                        std::function<void(const absl::Status&)> done,
                                        const ServedModel** model) = 0;

  // The driver's thread only: whether new calls may still be posted, and
  // the count of live calls (posted, or received and not yet freed).
  bool posting() const { return !stopping_; }
  void Added() { ++live_; }
  void Removed() { --live_; }

 protected:
  bool stopping_ = false;
  int64_t live_ = 0;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_DRIVER_H_
