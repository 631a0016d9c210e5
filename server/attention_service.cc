#include "server/attention_service.h"

#include <deque>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/status_util.h"
#include "server/tensor_codec.h"

namespace attention::server {

void EncodeOutcome(RequestOutcome& outcome, v1::InferResponse* response) {
  EncodeTensor(outcome.output, response->mutable_output());
  if (outcome.attn_weights) EncodeTensor(*outcome.attn_weights, response->mutable_attn_weights());
  response->set_queue_us(outcome.queue_us);
  response->set_compute_us(outcome.compute_us);
  response->set_batch_requests(outcome.batch_requests);
}

void DescribeModel(const ServedModel& model, bool is_default, v1::ModelInfo* info) {
  const MhaSpec& s = model.model->spec();
  info->set_name(model.name);
  info->set_embed_dim(s.embed_dim);
  info->set_num_heads(s.num_heads);
  info->set_kdim(s.kdim);
  info->set_vdim(s.vdim);
  info->set_bias(s.bias);
  info->set_add_bias_kv(s.add_bias_kv);
  info->set_add_zero_attn(s.add_zero_attn);
  info->set_compute_dtype(ToProtoDType(s.compute_dtype));
  const BatchingOptions& b = model.batcher->options();
  info->mutable_batching()->set_max_batch_size(b.max_batch_size);
  info->mutable_batching()->set_max_batch_tokens(b.max_batch_tokens);
  info->mutable_batching()->set_max_queue_delay_us(b.max_queue_delay_us);
  info->mutable_batching()->set_max_queue_size(b.max_queue_size);
  info->set_is_default(is_default);
}

AttentionServiceImpl::AttentionServiceImpl(Metrics* metrics, int64_t max_response_bytes)
    : metrics_(metrics), max_response_bytes_(max_response_bytes) {}

void AttentionServiceImpl::SetRepository(const ModelRepository* repository) {
  repository_.store(repository);
}

void AttentionServiceImpl::StartDraining() { draining_.store(true); }

bool AttentionServiceImpl::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return inflight_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void AttentionServiceImpl::Received() {
  metrics_->inflight_requests().Increment();
  absl::MutexLock lock(&mu_);
  ++inflight_;
}

void AttentionServiceImpl::Answered(const ServedModel* model, Method method, absl::StatusCode code,
                                    absl::Time received) {
  if (model != nullptr) {
    model->metrics->CountRequest(method, code);
    model->metrics->request_duration->Observe(absl::ToDoubleSeconds(absl::Now() - received));
  }
  if (code != absl::StatusCode::kOk && code != absl::StatusCode::kInvalidArgument &&
      code != absl::StatusCode::kNotFound && code != absl::StatusCode::kCancelled) {
    // Operational errors are logged; a client's bad input is its own business.
    static std::atomic<int64_t> logged{0};
    if (logged.fetch_add(1) < 100) {
      std::cerr << "request failed: " << StatusCodeName(code) << "\n";
    }
  }
  metrics_->inflight_requests().Decrement();
  absl::MutexLock lock(&mu_);
  --inflight_;
}

absl::Status AttentionServiceImpl::Prepare(const v1::InferRequest& request,
                                           std::shared_ptr<const void> keep_alive,
                                           grpc::CallbackServerContext* context,
                                           Prepared* prepared) {
  const ModelRepository* repository = repository_.load();
  if (repository == nullptr) return absl::UnavailableError("server is not ready yet");
  if (draining_.load()) return absl::UnavailableError("server is shutting down");
  prepared->model = repository->Find(request.model());
  if (prepared->model == nullptr) {
    return absl::NotFoundError(absl::StrCat("model: '", request.model(), "' is not served"));
  }
  auto pending = std::make_unique<PendingRequest>();
  MhaInputs& in = pending->inputs;
  ASSIGN_OR_RETURN(in.query, DecodeTensor(request.query(), "query"));
  ASSIGN_OR_RETURN(in.key, DecodeOptionalTensor(request.key(), "key"));
  ASSIGN_OR_RETURN(in.value, DecodeOptionalTensor(request.value(), "value"));
  ASSIGN_OR_RETURN(in.key_padding_mask,
                   DecodeOptionalTensor(request.key_padding_mask(), "key_padding_mask"));
  ASSIGN_OR_RETURN(in.attn_mask, DecodeOptionalTensor(request.attn_mask(), "attn_mask"));
  in.is_causal = request.is_causal();
  in.need_weights = request.need_weights();
  in.average_attn_weights = !request.per_head_weights();
  if (request.output_dtype() != v1::DATA_TYPE_UNSPECIFIED) {
    ASSIGN_OR_RETURN(DType out, FromProtoDType(request.output_dtype(), "output_dtype"));
    in.output_dtype = out;
  }
  ASSIGN_OR_RETURN(pending->call, prepared->model->engine->Validate(in));
  if (in.need_weights) {
    // Refuse up front what could never be sent back.
    const MhaSpec& spec = prepared->model->model->spec();
    const MhaCall& c = pending->call;
    const DType out_dtype = in.output_dtype.value_or(in.query.dtype);
    const int64_t bytes = c.batch * (in.average_attn_weights ? 1 : spec.num_heads) * c.queries *
                          (c.keys + spec.extra_keys()) * static_cast<int64_t>(DTypeSize(out_dtype));
    if (bytes > max_response_bytes_) {
      return absl::InvalidArgumentError(
          absl::StrCat("need_weights: the attention weights would be ", bytes,
                       " bytes, over the server's max_message_bytes ", max_response_bytes_));
    }
  }
  pending->keep_alive = std::move(keep_alive);
  const auto deadline = context->deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    pending->deadline = absl::FromChrono(deadline);
  }
  pending->is_cancelled = [context] { return context->IsCancelled(); };
  prepared->pending = std::move(pending);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Infer(grpc::CallbackServerContext* context,
                                                      const v1::InferRequest* request,
                                                      v1::InferResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time received = absl::Now();
  Received();
  response->set_request_id(request->request_id());
  Prepared prepared;
  absl::Status status = Prepare(*request, nullptr, context, &prepared);
  if (status.ok()) {
    const ServedModel* model = prepared.model;
    prepared.pending->done = [this, reactor, response, received, model](RequestOutcome outcome) {
      if (outcome.status.ok()) EncodeOutcome(outcome, response);
      const absl::StatusCode code = outcome.status.code();
      reactor->Finish(ToGrpcStatus(outcome.status));
      Answered(model, Method::kInfer, code, received);
    };
    status = model->batcher->Enqueue(std::move(prepared.pending));
  }
  if (!status.ok()) {
    reactor->Finish(ToGrpcStatus(status));
    Answered(prepared.model, Method::kInfer, status.code(), received);
  }
  return reactor;
}

// Many requests in flight on one stream. Each read request is prepared and
// queued on its own; completions (from batcher threads, in any order) queue
// their response for writing, one write at a time. The stream finishes once
// the client has half-closed, every request is answered and every response
// written. Owns itself: deleted in OnDone().
class AttentionServiceImpl::StreamReactor
    : public grpc::ServerBidiReactor<v1::InferRequest, v1::InferResponse> {
 public:
  StreamReactor(AttentionServiceImpl* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    StartNextRead();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // Half-close, cancellation or a broken stream.
      bool finish;
      {
        absl::MutexLock lock(&mu_);
        reads_done_ = true;
        finish = ShouldFinishLocked();
      }
      if (finish) Finish(grpc::Status::OK);
      return;
    }
    const absl::Time received = absl::Now();
    service_->Received();
    {
      absl::MutexLock lock(&mu_);
      ++unanswered_;
    }
    auto request = std::shared_ptr<v1::InferRequest>(incoming_.release());
    StartNextRead();
    Prepared prepared;
    absl::Status status = service_->Prepare(*request, request, context_, &prepared);
    const ServedModel* model = prepared.model;
    const std::string id = request->request_id();
    if (status.ok()) {
      prepared.pending->done = [this, id, received, model](RequestOutcome outcome) {
        v1::InferResponse response;
        response.set_request_id(id);
        if (outcome.status.ok()) {
          EncodeOutcome(outcome, &response);
        } else {
          response.mutable_error()->set_code(static_cast<int>(outcome.status.code()));
          response.mutable_error()->set_message(std::string(outcome.status.message()));
        }
        Respond(std::move(response), model, outcome.status.code(), received);
      };
      status = model->batcher->Enqueue(std::move(prepared.pending));
    }
    if (!status.ok()) {
      v1::InferResponse response;
      response.set_request_id(id);
      response.mutable_error()->set_code(static_cast<int>(status.code()));
      response.mutable_error()->set_message(std::string(status.message()));
      Respond(std::move(response), model, status.code(), received);
    }
  }

  void OnWriteDone(bool ok) override {
    const v1::InferResponse* next = nullptr;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      writes_.pop_front();
      if (!ok) broken_ = true;  // The client is gone: drop what is left.
      if (broken_) writes_.clear();
      if (!writes_.empty()) {
        next = &writes_.front();
      } else {
        writing_ = false;
        finish = ShouldFinishLocked();
      }
    }
    // gRPC calls are made without the lock held.
    if (next != nullptr) StartWrite(next);
    if (finish) Finish(grpc::Status::OK);
  }

  void OnDone() override { delete this; }

 private:
  void StartNextRead() {
    incoming_ = std::make_unique<v1::InferRequest>();
    StartRead(incoming_.get());
  }

  void Respond(v1::InferResponse response, const ServedModel* model, absl::StatusCode code,
               absl::Time received) {
    AttentionServiceImpl* const service = service_;  // `this` may be gone after Finish().
    const v1::InferResponse* write = nullptr;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      --unanswered_;
      if (!broken_) {
        writes_.push_back(std::move(response));
        if (!writing_) {
          writing_ = true;
          write = &writes_.front();
        }
      }
      finish = ShouldFinishLocked();
    }
    if (write != nullptr) StartWrite(write);
    if (finish) Finish(grpc::Status::OK);
    service->Answered(model, Method::kInferStream, code, received);
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

  AttentionServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  std::unique_ptr<v1::InferRequest> incoming_;  // Only the reaction thread touches it.
  absl::Mutex mu_;
  std::deque<v1::InferResponse> writes_ ABSL_GUARDED_BY(mu_);  // Front is being written.
  int64_t unanswered_ ABSL_GUARDED_BY(mu_) = 0;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerBidiReactor<v1::InferRequest, v1::InferResponse>* AttentionServiceImpl::InferStream(
    grpc::CallbackServerContext* context) {
  return new StreamReactor(this, context);
}

grpc::ServerUnaryReactor* AttentionServiceImpl::ListModels(grpc::CallbackServerContext* context,
                                                           const v1::ListModelsRequest*,
                                                           v1::ListModelsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const ModelRepository* repository = repository_.load();
  if (repository == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is not ready yet"));
    return reactor;
  }
  for (const ServedModel* m : repository->models()) {
    DescribeModel(*m, m->name == repository->default_model(), response->add_models());
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AttentionServiceImpl::GetModel(grpc::CallbackServerContext* context,
                                                         const v1::GetModelRequest* request,
                                                         v1::ModelInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const ModelRepository* repository = repository_.load();
  if (repository == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is not ready yet"));
    return reactor;
  }
  const ServedModel* m = repository->Find(request->name());
  if (m == nullptr) {
    reactor->Finish(ToGrpcStatus(
        absl::NotFoundError(absl::StrCat("name: model '", request->name(), "' is not served"))));
    return reactor;
  }
  DescribeModel(*m, m->name == repository->default_model(), response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace attention::server
