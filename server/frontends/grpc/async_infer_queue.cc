#include "server/frontends/grpc/async_infer_queue.h"

#include <pthread.h>

#include <utility>

#include "server/frontends/grpc/async_infer_call.h"
#include "server/frontends/grpc/async_model_infer_call.h"
#include "server/frontends/grpc/attention_service.h"
#include "server/frontends/protocol/inference_protocol.h"

namespace attention::server {

AsyncInferQueue::AsyncInferQueue(AttentionServiceImpl* service, RawModelInfer* inference,
                                 InferenceProtocol* protocol, RequestPath* path,
                                 std::unique_ptr<grpc::ServerCompletionQueue> cq, int parse_threads)
    : service_(service),
      inference_(inference),
      protocol_(protocol),
      path_(path),
      cq_(std::move(cq)),
      parse_pool_(parse_threads) {}

AsyncInferQueue::~AsyncInferQueue() { Stop(); }

void AsyncInferQueue::Start() {
  started_ = true;
  // Before the thread starts, this thread is the queue's.
  for (int i = 0; i < kPostedCalls; ++i) {
    AsyncInferCall::Post(this);
    AsyncModelInferCall::Post(this);
  }
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "infer-cq");  // For profiles and /proc.
    Loop();
  });
}

void AsyncInferQueue::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (!started_) {  // Nothing posted: nothing to wait for.
    {
      absl::MutexLock lock(&mu_);
      cq_shut_ = true;
    }
    cq_->Shutdown();
    void* tag;
    bool ok;
    while (cq_->Next(&tag, &ok)) {
    }
    parse_pool_.Stop();
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    stop_asked_ = true;
  }
  Wake(/*always=*/true);
  thread_.join();
  // Every call is gone (the thread ends once none is live), those the pool
  // held among them: it is idle.
  parse_pool_.Stop();
}

void AsyncInferQueue::RequestInfer(grpc::ServerContext* context, grpc::ByteBuffer* request,
                                   grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* responder,
                                   void* tag) {
  service_->RequestInfer(context, request, responder, cq_.get(), cq_.get(), tag);
}

void AsyncInferQueue::RequestModelInfer(
    grpc::ServerContext* context, grpc::ByteBuffer* request,
    grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* responder, void* tag) {
  inference_->RequestModelInfer(context, request, responder, cq_.get(), cq_.get(), tag);
}

absl::Status AsyncInferQueue::Prepare(const v1::InferRequest& request, const Principal* caller,
                                      const CallContext& call, RequestPath::Prepared* prepared) {
  return service_->PrepareGated(request, caller, call, prepared);
}

absl::Status AsyncInferQueue::SubmitModelInfer(
    CallRef call, const inference::ModelInferRequest& request, int64_t request_bytes,
    inference::ModelInferResponse* response, AdmissionHolder* holder,
    std::function<void(const absl::Status&)> done, const ServedModel** model) {
  return protocol_->Submit(std::move(call), request, request_bytes, response, holder,
                           std::move(done), model, this);
}

bool AsyncInferQueue::Parse(int64_t bytes, absl::AnyInvocable<void() &&> task) {
  return parse_pool_.Post(bytes, std::move(task));
}

absl::Status AsyncInferQueue::Encode(RequestOutcome& outcome, v1::InferResponse* response) {
  return EncodeOutcome(outcome, path_->options().max_response_bytes, response);
}

void AsyncInferQueue::Complete(AsyncUnaryCall* call) {
  absl::MutexLock lock(&mu_);
  ready_.push_back(call);
}

void AsyncInferQueue::Flush() { Wake(/*always=*/false); }

void AsyncInferQueue::Wake(bool always) {
  {
    absl::MutexLock lock(&mu_);
    if (armed_ || cq_shut_ || (!always && ready_.empty())) return;
    armed_ = true;
  }
  // A deadline in the past: gRPC queues the alarm's tag at once, on this
  // thread, and wakes the queue's thread.
  alarm_.Set(cq_.get(), gpr_time_0(GPR_CLOCK_MONOTONIC), &alarm_tag_);
}

void AsyncInferQueue::Loop() {
  void* tag = nullptr;
  bool ok = false;
  while (cq_->Next(&tag, &ok)) {
    if (tag == &alarm_tag_) {
      OnAlarm();
    } else {
      AsyncUnaryCall::Handle(static_cast<AsyncUnaryCall::Tag*>(tag), ok);
    }
    if (stopping_ && live_ == 0) MaybeShutDown();
  }
}

void AsyncInferQueue::OnAlarm() {
  std::vector<AsyncUnaryCall*> ready;
  {
    absl::MutexLock lock(&mu_);
    armed_ = false;
    ready.swap(ready_);
    if (stop_asked_) stopping_ = true;
  }
  for (AsyncUnaryCall* call : ready) call->Finish();
}

void AsyncInferQueue::MaybeShutDown() {
  if (shut_down_) return;
  {
    absl::MutexLock lock(&mu_);
    // A Wake() may be about to set the alarm: its tag comes first.
    if (armed_) return;
    cq_shut_ = true;
  }
  shut_down_ = true;
  cq_->Shutdown();
}

}  // namespace attention::server
