#include "server/frontends/grpc/attention_service.h"

#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "proto/codec/status_codes.h"
#include "proto/codec/tensor_codec.h"
#include "server/frontends/grpc/grpc_call.h"
#include "server/frontends/grpc/stream_reactor.h"
#include "server/frontends/protocol/message_limit.h"
#include "server/requests/identifiers.h"

namespace attention::server {

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

void DescribeModel(const ServedModel& model, bool is_default, const ModelRepository& repository,
                   v1::ModelInfo* info) {
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
  info->set_batch_first(model.model->serving().batch_first);
  const BatchingOptions& b = model.batcher->options();
  info->mutable_batching()->set_max_batch_size(b.max_batch_size);
  info->mutable_batching()->set_max_batch_tokens(b.max_batch_tokens);
  info->mutable_batching()->set_max_queue_delay_us(b.max_queue_delay_us);
  info->mutable_batching()->set_max_queue_size(b.max_queue_size);
  info->set_is_default(is_default);
  info->set_version(model.version);
  for (const VersionState& v : repository.Index(model.name)) {
    v1::ModelVersionState* state = info->add_versions();
    state->set_version(v.version);
    state->set_state(v.state);
    state->set_reason(v.reason);
  }
}

absl::Status AttentionServiceImpl::Prepare(const v1::InferRequest& request,
                                           std::shared_ptr<const void> keep_alive,
                                           const CallContext& call, Prepared* prepared) {
  return PrepareWith(request, std::move(keep_alive), call, prepared, [&] {
    return path_->Admissible(call, request.model(), nullptr, request.model_version());
  });
}

absl::Status AttentionServiceImpl::PrepareGated(const v1::InferRequest& request,
                                                const Principal* caller, const CallContext& call,
                                                Prepared* prepared) {
  return PrepareWith(request, nullptr, call, prepared, [&] {
    return path_->FindModel(caller, request.model(), request.model_version(), &call);
  });
}

absl::Status AttentionServiceImpl::PrepareWith(
    const v1::InferRequest& request, std::shared_ptr<const void> keep_alive,
    const CallContext& call, Prepared* prepared,
    absl::FunctionRef<absl::StatusOr<const ServedModel*>()> find) {
  RETURN_IF_ERROR(CheckIdentifier(request.request_id(), "request_id"));
  if (request.model_version() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_version: expected 0 (the newest) or a version number, got ",
                     request.model_version()));
  }
  ASSIGN_OR_RETURN(prepared->model, find());
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
  return path_->Finalize(std::move(pending), request.request_id().size(), std::move(keep_alive),
                         call, prepared);
}

grpc::ServerBidiReactor<v1::InferRequest, v1::InferResponse>* AttentionServiceImpl::InferStream(
    grpc::CallbackServerContext* context) {
  using Reactor = StreamReactor<v1::InferRequest, v1::InferResponse>;
  return new Reactor(path_, context, Method::kInferStream,
                     [this](std::shared_ptr<v1::InferRequest> request, const CallContext& call) {
                       Reactor::Prepared out;
                       auto prepared = std::make_shared<Prepared>();
                       out.status = Prepare(*request, request, call, prepared.get());
                       out.model = prepared->model;
                       out.response_bytes = prepared->response_bytes;
                       out.submit = [this, prepared](Reactor::Reply reply, Admission*) {
                         const int64_t max_bytes = path_->options().max_response_bytes;
                         const int64_t version = prepared->model->version;
                         prepared->pending->done = [reply, max_bytes,
                                                    version](RequestOutcome outcome) {
                           v1::InferResponse response;
                           absl::Status result = outcome.status;
                           if (result.ok()) result = EncodeOutcome(outcome, max_bytes, &response);
                           if (result.ok()) response.set_model_version(version);
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
  const auto models = path_->VisibleModels(*CallOf(context, Method::kInfer));
  if (models.ok()) {
    const std::string& default_model = path_->repository()->default_model();
    for (const ServedModel* m : *models) {
      DescribeModel(*m, m->name == default_model, *path_->repository(), response->add_models());
    }
  }
  reactor->Finish(wire::ToGrpcStatus(models.status()));
  return reactor;
}

grpc::ServerUnaryReactor* AttentionServiceImpl::GetModel(grpc::CallbackServerContext* context,
                                                         const v1::GetModelRequest* request,
                                                         v1::ModelInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const ModelRepository* repository = path_->repository();
  if (repository == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is not ready yet"));
    return reactor;
  }
  CallRef call = CallOf(context, Method::kInfer);
  auto principal = path_->Authenticate(*call);
  absl::StatusOr<const ServedModel*> m =
      principal.ok()
          ? path_->FindModel(principal->get(), request->name(), request->version(), call.get())
          : absl::StatusOr<const ServedModel*>(principal.status());
  if (!m.ok()) {
    reactor->Finish(wire::ToGrpcStatus(m.status()));
    return reactor;
  }
  DescribeModel(**m, (*m)->name == repository->default_model(), *repository, response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AttentionServiceImpl::LoadModel(grpc::CallbackServerContext* context,
                                                          const v1::LoadModelRequest* request,
                                                          v1::LoadModelResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const std::string name = request->name();
  path_->ControlModel(*CallOf(context, Method::kInfer), name, /*load=*/true,
                      [this, reactor, response, name](const absl::Status& status) {
                        if (status.ok()) {
                          for (const VersionState& v : path_->repository()->Index(name)) {
                            if (v.state == "READY") response->add_versions(v.version);
                          }
                        }
                        reactor->Finish(wire::ToGrpcStatus(status));
                      });
  return reactor;
}

grpc::ServerUnaryReactor* AttentionServiceImpl::UnloadModel(grpc::CallbackServerContext* context,
                                                            const v1::UnloadModelRequest* request,
                                                            v1::UnloadModelResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  path_->ControlModel(
      *CallOf(context, Method::kInfer), request->name(), /*load=*/false,
      [reactor](const absl::Status& status) { reactor->Finish(wire::ToGrpcStatus(status)); });
  return reactor;
}

}  // namespace attention::server
