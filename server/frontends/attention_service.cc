#include "server/frontends/attention_service.h"

#include <initializer_list>
#include <iostream>
#include <limits>
#include <new>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/status_macros.h"
#include "proto/codec/status_codes.h"
#include "proto/codec/tensor_codec.h"
#include "server/batching/batch_runner.h"
#include "server/frontends/admitted_reactor.h"
#include "server/frontends/message_limit.h"
#include "server/frontends/stream_reactor.h"
#include "server/requests/identifiers.h"

namespace attention::server {

void BindCall(grpc::CallbackServerContext* context, PendingRequest* pending) {
  const auto deadline = context->deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    pending->deadline = absl::FromChrono(deadline);
  }
  pending->is_cancelled = [context] { return context->IsCancelled(); };
}

absl::Status EncodeOutcome(RequestOutcome& outcome, int64_t max_bytes,
                           v1::InferResponse* response) {
  try {
    OutputTensor& out = outcome.output;
    wire::EncodeTensorBytes(out.dtype, out.shape, std::move(out.bytes), response->mutable_output());
    if (outcome.attn_weights) {
      OutputTensor& w = *outcome.attn_weights;
      wire::EncodeTensorBytes(w.dtype, w.shape, std::move(w.bytes),
                              response->mutable_attn_weights());
    }
  } catch (const std::bad_alloc&) {
    response->Clear();
    return absl::ResourceExhaustedError("out of memory encoding the response; retry later");
  }
  response->set_queue_us(outcome.queue_us);
  response->set_compute_us(outcome.compute_us);
  response->set_batch_requests(outcome.batch_requests);
  return CheckMessageLimit(response, max_bytes);
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
  info->set_compute_dtype(wire::ToProtoDType(s.compute_dtype));
  const BatchingOptions& b = model.batcher->options();
  info->mutable_batching()->set_max_batch_size(b.max_batch_size);
  info->mutable_batching()->set_max_batch_tokens(b.max_batch_tokens);
  info->mutable_batching()->set_max_queue_delay_us(b.max_queue_delay_us);
  info->mutable_batching()->set_max_queue_size(b.max_queue_size);
  info->set_is_default(is_default);
}

namespace {

// a x b x ..., saturating at INT64_MAX instead of overflowing.
int64_t SaturatingProduct(std::initializer_list<int64_t> factors) {
  int64_t product = 1;
  for (int64_t f : factors) {
    if (!CheckedMul(product, f, &product)) return std::numeric_limits<int64_t>::max();
  }
  return product;
}

}  // namespace

absl::Status AttentionServiceImpl::CheckResponseSize(const ServedModel& model, const MhaInputs& in,
                                                     const MhaCall& c, size_t id_bytes,
                                                     int64_t* response_bytes) const {
  const MhaSpec& spec = model.model->spec();
  const MhaEngine& engine = *model.engine;
  const int64_t max_working = model.batcher->options().max_working_bytes;
  const int64_t out_size =
      static_cast<int64_t>(DTypeSize(in.output_dtype.value_or(in.query.dtype)));
  const int64_t total_keys = c.keys + spec.extra_keys();
  const int64_t output_bytes = SaturatingProduct({c.batch, c.queries, spec.embed_dim, out_size});
  int64_t weights_bytes = 0;
  if (in.need_weights) {
    // The batch computes per-head float32 weights whatever the request asks.
    const int64_t buffer = SaturatingProduct({c.batch, spec.num_heads, c.queries, total_keys, 4});
    if (buffer > DynamicBatcher::kMaxBatchWeightsBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("need_weights: computing the attention weights takes ", buffer,
                       " bytes (batch x heads x queries x keys x 4), over the server's limit of ",
                       DynamicBatcher::kMaxBatchWeightsBytes));
    }
    weights_bytes = SaturatingProduct(
        {c.batch, in.average_attn_weights ? 1 : spec.num_heads, c.queries, total_keys, out_size});
  }
  // Field tags and lengths, shapes, timings: well under this.
  constexpr int64_t kFramingBytes = 1024;
  *response_bytes = output_bytes + weights_bytes + kFramingBytes + static_cast<int64_t>(id_bytes);
  if (*response_bytes > options_.max_response_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("response: would be about ", *response_bytes, " bytes (output ", output_bytes,
                     ", attn_weights ", weights_bytes, "), over the server's max_message_bytes ",
                     options_.max_response_bytes));
  }
  const int64_t working =
      BatchWorkingBytes(engine, c.batch, c.queries, c.keys, c.self_attention, in.need_weights);
  if (working > max_working) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request: computing it takes about ", working,
                     " bytes of working memory (padded inputs, projections, attention buffers",
                     in.need_weights ? ", weights" : "", "), over the server's limit of ",
                     max_working, " per batch; send fewer or shorter sequences"));
  }
  return absl::OkStatus();
}

AttentionServiceImpl::AttentionServiceImpl(Metrics* metrics, ServiceOptions options)
    : metrics_(metrics), options_(options), budget_(options.max_inflight_bytes, metrics) {}

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
    const double seconds = absl::ToDoubleSeconds(absl::Now() - received);
    if (method == Method::kInfer || method == Method::kInferStream ||
        method == Method::kModelInfer || method == Method::kModelStreamInfer) {
      model->metrics->request_duration->Observe(seconds);
    } else if (method == Method::kAppend || method == Method::kSessionStream) {
      model->metrics->append_duration->Observe(seconds);
    }
  }
  if (code != absl::StatusCode::kOk && code != absl::StatusCode::kInvalidArgument &&
      code != absl::StatusCode::kNotFound && code != absl::StatusCode::kCancelled &&
      code != absl::StatusCode::kFailedPrecondition) {
    // Operational errors are logged; a client's bad input is its own business.
    static std::atomic<int64_t> logged{0};
    if (logged.fetch_add(1) < 100) {
      std::cerr << "request failed: " << wire::StatusCodeName(code) << "\n";
    }
  }
  metrics_->inflight_requests().Decrement();
  absl::MutexLock lock(&mu_);
  --inflight_;
}

absl::StatusOr<std::shared_ptr<const Principal>> AttentionServiceImpl::Authenticate(
    const grpc::CallbackServerContext* context) const {
  if (options_.authenticator == nullptr) return nullptr;
  const auto& metadata = context->client_metadata();
  const auto it = metadata.find("authorization");
  absl::string_view value;
  if (it != metadata.end()) value = absl::string_view(it->second.data(), it->second.size());
  auto principal = options_.authenticator->Authenticate(it == metadata.end() ? nullptr : &value);
  if (!principal.ok()) metrics_->CountRefusal(principal.status().code());
  return principal;
}

absl::StatusOr<const ServedModel*> AttentionServiceImpl::FindModel(const Principal* principal,
                                                                   const std::string& name) const {
  const ModelRepository* repository = repository_.load();
  if (repository == nullptr) return absl::UnavailableError("server is not ready yet");
  RETURN_IF_ERROR(CheckIdentifier(name, "model"));
  if (name.empty() && principal != nullptr && !principal->all_models) {
    // The default among the caller's own models (the server's default when
    // it may use that, else its first served model by name), so that a
    // refusal never names a model the caller may not know of.
    const ServedModel* fallback = repository->Find(name);
    if (fallback != nullptr && principal->MayUse(fallback->name)) return fallback;
    for (const ServedModel* m : repository->models()) {
      if (principal->MayUse(m->name)) return m;
    }
    metrics_->CountRefusal(absl::StatusCode::kPermissionDenied);
    return absl::PermissionDeniedError(
        absl::StrCat("model: caller '", principal->name, "' may use no served model"));
  }
  const ServedModel* model = repository->Find(name);
  const std::string& shown = model != nullptr ? model->name : name;
  if (principal != nullptr && !principal->MayUse(shown) &&
      (model != nullptr || !principal->all_models)) {
    metrics_->CountRefusal(absl::StatusCode::kPermissionDenied);
    return absl::PermissionDeniedError(absl::StrCat("model: caller '", principal->name,
                                                    "' may not use model '", Shown(shown), "'"));
  }
  if (model == nullptr) {
    return absl::NotFoundError(absl::StrCat("model: '", Shown(name), "' is not served"));
  }
  return model;
}

absl::Status AttentionServiceImpl::Admit(int64_t bytes) { return budget_.Admit(bytes); }

void AttentionServiceImpl::Release(int64_t bytes) { budget_.Release(bytes); }

absl::StatusOr<const ServedModel*> AttentionServiceImpl::Admissible(
    grpc::CallbackServerContext* context, const std::string& model,
    std::shared_ptr<const Principal>* caller) {
  if (repository_.load() == nullptr) return absl::UnavailableError("server is not ready yet");
  if (draining_.load()) return absl::UnavailableError("server is shutting down");
  ASSIGN_OR_RETURN(std::shared_ptr<const Principal> principal, Authenticate(context));
  if (caller != nullptr) *caller = principal;
  return FindModel(principal.get(), model);
}

absl::Status AttentionServiceImpl::Finalize(std::unique_ptr<PendingRequest> pending,
                                            size_t id_bytes, std::shared_ptr<const void> keep_alive,
                                            grpc::CallbackServerContext* context,
                                            Prepared* prepared) {
  ASSIGN_OR_RETURN(pending->call, prepared->model->engine->Validate(pending->inputs));
  RETURN_IF_ERROR(CheckResponseSize(*prepared->model, pending->inputs, pending->call, id_bytes,
                                    &prepared->response_bytes));
  pending->keep_alive = std::move(keep_alive);
  BindCall(context, pending.get());
  prepared->pending = std::move(pending);
  return absl::OkStatus();
}

absl::Status AttentionServiceImpl::Submit(Prepared& prepared, int64_t request_bytes,
                                          std::function<void(RequestOutcome)> done,
                                          AdmittedUnaryReactor* reactor) {
  ASSIGN_OR_RETURN(std::shared_ptr<Admission> held,
                   budget_.Take(request_bytes + prepared.response_bytes));
  // Held until the response is sent (by the reactor) or answered.
  prepared.pending->done = [held, reactor, done = std::move(done)](RequestOutcome outcome) mutable {
    if (reactor != nullptr) reactor->Hold(std::move(held));
    held.reset();
    done(std::move(outcome));
  };
  return prepared.model->batcher->Enqueue(std::move(prepared.pending));
}

absl::Status AttentionServiceImpl::Prepare(const v1::InferRequest& request,
                                           std::shared_ptr<const void> keep_alive,
                                           grpc::CallbackServerContext* context,
                                           Prepared* prepared) {
  RETURN_IF_ERROR(CheckIdentifier(request.request_id(), "request_id"));
  ASSIGN_OR_RETURN(prepared->model, Admissible(context, request.model()));
  auto pending = std::make_unique<PendingRequest>();
  MhaInputs& in = pending->inputs;
  ASSIGN_OR_RETURN(in.query, wire::DecodeTensor(request.query(), "query"));
  ASSIGN_OR_RETURN(in.key, wire::DecodeOptionalTensor(request.key(), "key"));
  ASSIGN_OR_RETURN(in.value, wire::DecodeOptionalTensor(request.value(), "value"));
  ASSIGN_OR_RETURN(in.key_padding_mask,
                   wire::DecodeOptionalTensor(request.key_padding_mask(), "key_padding_mask"));
  ASSIGN_OR_RETURN(in.attn_mask, wire::DecodeOptionalTensor(request.attn_mask(), "attn_mask"));
  in.is_causal = request.is_causal();
  in.need_weights = request.need_weights();
  in.average_attn_weights = !request.per_head_weights();
  if (request.output_dtype() != v1::DATA_TYPE_UNSPECIFIED) {
    ASSIGN_OR_RETURN(DType out, wire::FromProtoDType(request.output_dtype(), "output_dtype"));
    in.output_dtype = out;
  }
  return Finalize(std::move(pending), request.request_id().size(), std::move(keep_alive), context,
                  prepared);
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Infer(grpc::CallbackServerContext* context,
                                                      const v1::InferRequest* request,
                                                      v1::InferResponse* response) {
  auto* reactor = new AdmittedUnaryReactor();
  const absl::Time received = absl::Now();
  Received();
  response->set_request_id(request->request_id());
  Prepared prepared;
  absl::Status status = Prepare(*request, nullptr, context, &prepared);
  if (status.ok()) {
    const ServedModel* model = prepared.model;
    status = Submit(
        prepared, static_cast<int64_t>(request->ByteSizeLong()),
        [this, reactor, response, received, model](RequestOutcome outcome) {
          absl::Status result = outcome.status;
          if (result.ok()) {
            result = EncodeOutcome(outcome, options_.max_response_bytes, response);
          }
          Answered(model, Method::kInfer, result.code(), received);
          reactor->Finish(wire::ToGrpcStatus(result));
        },
        reactor);
  }
  if (!status.ok()) {
    Answered(prepared.model, Method::kInfer, status.code(), received);
    reactor->Finish(wire::ToGrpcStatus(status));
  }
  return reactor;
}

grpc::ServerBidiReactor<v1::InferRequest, v1::InferResponse>* AttentionServiceImpl::InferStream(
    grpc::CallbackServerContext* context) {
  using Reactor = StreamReactor<v1::InferRequest, v1::InferResponse>;
  return new Reactor(
      this, context, Method::kInferStream,
      [this](std::shared_ptr<v1::InferRequest> request, grpc::CallbackServerContext* call) {
        Reactor::Prepared out;
        auto prepared = std::make_shared<Prepared>();
        out.status = Prepare(*request, request, call, prepared.get());
        out.model = prepared->model;
        out.response_bytes = prepared->response_bytes;
        out.submit = [this, prepared](Reactor::Reply reply, Admission*) {
          const int64_t max_bytes = options_.max_response_bytes;
          prepared->pending->done = [reply, max_bytes](RequestOutcome outcome) {
            v1::InferResponse response;
            absl::Status result = outcome.status;
            if (result.ok()) result = EncodeOutcome(outcome, max_bytes, &response);
            reply(std::move(response), result);
          };
          return prepared->model->batcher->Enqueue(std::move(prepared->pending));
        };
        return out;
      });
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
  auto principal = Authenticate(context);
  if (!principal.ok()) {
    reactor->Finish(wire::ToGrpcStatus(principal.status()));
    return reactor;
  }
  // A caller sees only the models it may use.
  for (const ServedModel* m : repository->models()) {
    if (*principal != nullptr && !(*principal)->MayUse(m->name)) continue;
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
  auto principal = Authenticate(context);
  absl::StatusOr<const ServedModel*> m =
      principal.ok() ? FindModel(principal->get(), request->name())
                     : absl::StatusOr<const ServedModel*>(principal.status());
  if (!m.ok()) {
    reactor->Finish(wire::ToGrpcStatus(m.status()));
    return reactor;
  }
  DescribeModel(**m, (*m)->name == repository->default_model(), response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace attention::server
