// File: server/frontends/grpc/async_infer_driver.h
//
// AsyncInferDriver: what an AsyncInferCall needs of the queue that drives
// it (AsyncInferQueue), so that a call knows neither the queue nor the
// service: asking gRPC for the next call, the service's decoding and
// encoding, the request path, and the hand-back of an answered call. An
// OutcomeFlush: the calls' requests name it to the batcher.
//
// Thread-safety as AsyncInferQueue documents each member.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_DRIVER_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_ASYNC_INFER_DRIVER_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "attention/v1/attention.grpc.pb.h"
#include "server/batching/outcome_flush.h"
#include "server/batching/pending_request.h"
#include "server/requests/call_context.h"
#include "server/requests/request_path.h"

namespace attention::server {

class AsyncInferCall;

class AsyncInferDriver : public OutcomeFlush {
 public:
  // The driver's thread: asks gRPC for the next Infer call, delivered as
  // `tag` on the driver's completion queue.
  virtual void RequestCall(grpc::ServerContext* context, v1::InferRequest* request,
                           grpc::ServerAsyncResponseWriter<v1::InferResponse>* responder,
                           void* tag) = 0;
  // The driver's thread: the service's AttentionServiceImpl::Prepare.
  virtual absl::Status Prepare(const v1::InferRequest& request, const CallContext& call,
                               RequestPath::Prepared* prepared) = 0;
  // Any thread: fills `response` from `outcome` (EncodeOutcome, the
  // server's response limit).
  virtual absl::Status Encode(RequestOutcome& outcome, v1::InferResponse* response) = 0;
  // A batcher thread: `call`'s answer is ready; it is sent after the next
  // Flush().
  virtual void Complete(AsyncInferCall* call) = 0;
  virtual RequestPath* path() const = 0;

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
