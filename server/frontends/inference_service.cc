#include "server/frontends/inference_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "proto/codec/status_codes.h"
#include "server/frontends/admitted_reactor.h"
#include "server/frontends/grpc_call.h"
#include "server/frontends/oip_model_info.h"
#include "server/frontends/sequence_sessions.h"
#include "server/requests/identifiers.h"

namespace attention::server {
namespace {

constexpr char kModelVersion[] = "1";

}  // namespace

InferenceServiceImpl::InferenceServiceImpl(RequestPath* requests, SequenceSessions* sequences,
                                           std::string version)
    : requests_(requests), sequences_(sequences), version_(std::move(version)) {}

absl::StatusOr<const ServedModel*> InferenceServiceImpl::Model(
    const CallContext& call, const std::string& name, const std::string& version,
    std::shared_ptr<const Principal>* caller, bool* stateful) {
  RETURN_IF_ERROR(CheckIdentifier(version, "model_version"));
  absl::StatusOr<const ServedModel*> found = requests_->Admissible(call, name, caller);
  const bool unknown = found.status().code() == absl::StatusCode::kNotFound ||
                       found.status().code() == absl::StatusCode::kPermissionDenied;
  if (unknown && sequences_ != nullptr && absl::EndsWith(name, kSequenceSuffix)) {
    auto base =
        requests_->Admissible(call, name.substr(0, name.size() - kSequenceSuffix.size()), caller);
    if (base.ok()) {
      found = base;
      if (stateful != nullptr) *stateful = true;
    }
  }
  ASSIGN_OR_RETURN(const ServedModel* model, std::move(found));
  RETURN_IF_ERROR(CheckVersion(absl::StrCat("model '", model->name, "'"), version));
  return model;
}

absl::Status InferenceServiceImpl::CheckVersion(const std::string& what,
                                                const std::string& version) {
  if (version.empty() || version == kModelVersion) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("model_version: ", what, " has version '", kModelVersion,
                                          "' only, got '", Shown(version), "'"));
}

void InferenceServiceImpl::Label(const inference::ModelInferRequest& request,
                                 const ServedModel* model,
                                 inference::ModelInferResponse* response) {
  // The stateful alias is echoed as asked.
  const bool alias = model != nullptr && request.model_name() == SequenceAlias(model->name);
  response->set_model_name(model != nullptr && !alias ? model->name : request.model_name());
  response->set_model_version(kModelVersion);
  response->set_id(Echoed(request.id()));
}

// Probes answer without a token unless --auth_probes.
#define ATTENTION_PROBE_AUTH(context, reactor)                                   \
  if (requests_->options().authenticate_health) {                                \
    const absl::Status allowed =                                                 \
        requests_->Authenticate(*CallOf(context, Method::kModelInfer)).status(); \
    if (!allowed.ok()) {                                                         \
      (reactor)->Finish(wire::ToGrpcStatus(allowed));                            \
      return reactor;                                                            \
    }                                                                            \
  }

grpc::ServerUnaryReactor* InferenceServiceImpl::ServerLive(
    grpc::CallbackServerContext* context, const inference::ServerLiveRequest*,
    inference::ServerLiveResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  ATTENTION_PROBE_AUTH(context, reactor);
  response->set_live(true);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ServerReady(
    grpc::CallbackServerContext* context, const inference::ServerReadyRequest*,
    inference::ServerReadyResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  ATTENTION_PROBE_AUTH(context, reactor);
  response->set_ready(requests_->repository() != nullptr && !requests_->draining());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  ATTENTION_PROBE_AUTH(context, reactor);
  response->set_name("attention-service");
  response->set_version(version_);
  // Triton's extension names for what is really supported: request
  // parameters, and (with sessions) sequences.
  response->add_extensions("parameters");
  response->add_extensions("model_configuration");
  response->add_extensions("statistics");
  if (sequences_ != nullptr) response->add_extensions("sequence");
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

#undef ATTENTION_PROBE_AUTH

grpc::ServerUnaryReactor* InferenceServiceImpl::ModelReady(
    grpc::CallbackServerContext* context, const inference::ModelReadyRequest* request,
    inference::ModelReadyResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (requests_->draining()) {  // Drained models are not ready; not an error.
    response->set_ready(false);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  const auto model =
      Model(*CallOf(context, Method::kModelInfer), request->name(), request->version());
  if (model.ok()) response->set_ready(true);
  reactor->Finish(wire::ToGrpcStatus(model.status()));
  return reactor;
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  bool stateful = false;
  const auto model = Model(*CallOf(context, Method::kModelInfer), request->name(),
                           request->version(), nullptr, &stateful);
  if (!model.ok()) {
    reactor->Finish(wire::ToGrpcStatus(model.status()));
    return reactor;
  }
  // The alias keeps its own name: tools address requests by it.
  DescribeModelMetadata(**model, stateful ? request->name() : (*model)->name, stateful, response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

absl::Status InferenceServiceImpl::Prepare(const inference::ModelInferRequest& request,
                                           OipRequest decoded,
                                           std::shared_ptr<const void> keep_alive,
                                           const CallContext& call,
                                           RequestPath::Prepared* prepared) {
  auto pending = std::make_unique<PendingRequest>();
  pending->inputs = std::move(decoded.inputs);
  RETURN_IF_ERROR(requests_->Finalize(std::move(pending), request.id().size(),
                                      std::move(keep_alive), call, prepared));
  if (decoded.timeout) {  // Triton's `timeout`: the longest wait in the queue.
    prepared->pending->deadline =
        std::min(prepared->pending->deadline, absl::Now() + *decoded.timeout);
  }
  // Outputs and their order ride along in the raw bytes' place: a response
  // of 2 outputs costs 2 small entries more than estimated.
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ModelInfer(
    grpc::CallbackServerContext* context, const inference::ModelInferRequest* request,
    inference::ModelInferResponse* response) {
  auto* reactor = new AdmittedUnaryReactor();
  const absl::Time received = absl::Now();
  requests_->Received();
  const CallRef call = CallOf(context, Method::kModelInfer);
  std::shared_ptr<const Principal> caller;
  const absl::StatusOr<const ServedModel*> model =
      Model(*call, request->model_name(), request->model_version(), &caller);
  absl::StatusOr<OipRequest> decoded =
      model.ok() ? DecodeModelInfer(*request) : absl::StatusOr<OipRequest>(model.status());
  const ServedModel* served = model.ok() ? *model : nullptr;
  Label(*request, served, response);
  auto finish = [this, reactor, received, served, call](const absl::Status& status) {
    requests_->Answered(served, *call, status, received);
    reactor->Finish(wire::ToGrpcStatus(status));
  };
  absl::Status status = decoded.status();
  if (status.ok()) status = CheckIdentifier(request->id(), "id");
  if (status.ok()) {
    const int64_t max_bytes = requests_->options().max_response_bytes;
    std::vector<OipOutput> outputs = decoded->outputs;
    auto done = [response, finish, outputs, max_bytes](RequestOutcome outcome) {
      absl::Status result = outcome.status;
      if (result.ok()) result = EncodeModelInfer(outcome, outputs, max_bytes, response);
      finish(result);
    };
    if (decoded->sequence_id) {
      status =
          sequences_ == nullptr
              ? absl::UnimplementedError("parameters['sequence_id']: this server has no sessions")
              : sequences_->Submit(*call, *request, *std::move(decoded), served, caller.get(),
                                   nullptr, std::move(done), reactor);
    } else {
      RequestPath::Prepared prepared;
      prepared.model = served;
      status = Prepare(*request, *std::move(decoded), nullptr, *call, &prepared);
      if (status.ok()) {
        status = requests_->Submit(prepared, static_cast<int64_t>(request->ByteSizeLong()),
                                   std::move(done), reactor);
      }
    }
  }
  if (!status.ok()) finish(status);
  return reactor;
}

grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
InferenceServiceImpl::ModelStreamInfer(grpc::CallbackServerContext* context) {
  using Reactor = StreamReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>;
  return new Reactor(
      requests_, context, Method::kModelStreamInfer,
      [this](std::shared_ptr<inference::ModelInferRequest> request, const CallContext& call) {
        Reactor::Prepared out;
        auto prepared = std::make_shared<RequestPath::Prepared>();
        std::shared_ptr<const Principal> caller;
        absl::StatusOr<const ServedModel*> model =
            Model(call, request->model_name(), request->model_version(), &caller);
        absl::StatusOr<OipRequest> decoded =
            model.ok() ? DecodeModelInfer(*request) : absl::StatusOr<OipRequest>(model.status());
        out.model = model.ok() ? *model : nullptr;
        out.status = decoded.status();
        if (out.status.ok()) out.status = CheckIdentifier(request->id(), "id");
        if (!out.status.ok()) return out;
        if (decoded->sequence_id) {
          // A sequence's steps on one stream are queued in the order read.
          if (sequences_ == nullptr) {
            out.status =
                absl::UnimplementedError("parameters['sequence_id']: this server has no sessions");
            return out;
          }
          const std::vector<OipOutput> outputs = decoded->outputs;
          auto step = sequences_->Prepare(call, *request, *std::move(decoded), out.model,
                                          caller.get(), request);
          out.status = step.status();
          if (!step.ok()) return out;
          out.response_bytes = SequenceSessions::ResponseBytes(**step);
          const int64_t max_bytes = requests_->options().max_response_bytes;
          const ServedModel* served = out.model;
          out.submit = [this, step = *std::move(step), outputs, max_bytes, served, request](
                           Reactor::Reply reply, Admission* admission) {
            return sequences_->Commit(
                step, admission,
                [reply, outputs, max_bytes, served, request](RequestOutcome outcome) {
                  inference::ModelStreamInferResponse response;
                  absl::Status result = outcome.status;
                  inference::ModelInferResponse* infer = response.mutable_infer_response();
                  Label(*request, served, infer);
                  if (result.ok()) result = EncodeModelInfer(outcome, outputs, max_bytes, infer);
                  reply(std::move(response), result);
                });
          };
          return out;
        }
        const std::vector<OipOutput> outputs = decoded->outputs;
        prepared->model = out.model;
        out.status = Prepare(*request, *std::move(decoded), request, call, prepared.get());
        out.response_bytes = prepared->response_bytes;
        const int64_t max_bytes = requests_->options().max_response_bytes;
        const ServedModel* served = out.model;
        out.submit = [prepared, outputs, max_bytes, served, request](Reactor::Reply reply,
                                                                     Admission*) {
          prepared->pending->done = [reply, outputs, max_bytes, served,
                                     request](RequestOutcome outcome) {
            inference::ModelStreamInferResponse response;
            absl::Status result = outcome.status;
            inference::ModelInferResponse* infer = response.mutable_infer_response();
            Label(*request, served, infer);
            if (result.ok()) result = EncodeModelInfer(outcome, outputs, max_bytes, infer);
            reply(std::move(response), result);
          };
          return prepared->model->batcher->Enqueue(std::move(prepared->pending));
        };
        return out;
      });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ModelConfig(
    grpc::CallbackServerContext* context, const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  bool stateful = false;
  const auto model = Model(*CallOf(context, Method::kModelInfer), request->name(),
                           request->version(), nullptr, &stateful);
  if (!model.ok()) {
    reactor->Finish(wire::ToGrpcStatus(model.status()));
    return reactor;
  }
  std::optional<absl::Duration> idle;
  if (stateful) idle = sequences_->IdleTimeout(*model);
  DescribeModelConfig(**model, stateful ? request->name() : (*model)->name, idle,
                      response->mutable_config());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ModelStatistics(
    grpc::CallbackServerContext* context, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const CallRef call = CallOf(context, Method::kModelInfer);
  const std::string version = request->version().empty() ? kModelVersion : request->version();
  if (!request->name().empty()) {
    bool stateful = false;
    const auto model = Model(*call, request->name(), request->version(), nullptr, &stateful);
    if (!model.ok()) {
      reactor->Finish(wire::ToGrpcStatus(model.status()));
      return reactor;
    }
    DescribeModelStatistics(**model, stateful ? request->name() : (*model)->name, version,
                            response->add_model_stats());
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  // Every model the caller may use.
  auto models = requests_->VisibleModels(*call);
  absl::Status status = models.status();
  if (status.ok()) status = CheckVersion("every model", request->version());
  if (status.ok()) {
    for (const ServedModel* m : *models) {
      DescribeModelStatistics(*m, m->name, version, response->add_model_stats());
    }
  }
  reactor->Finish(wire::ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* InferenceServiceImpl::RepositoryIndex(
    grpc::CallbackServerContext* context, const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto models = requests_->VisibleModels(*CallOf(context, Method::kModelInfer));
  absl::Status status = models.status();
  if (status.ok() && !request->repository_name().empty()) {
    status = absl::NotFoundError(
        absl::StrCat("repository_name: this server has one repository (leave it empty), got '",
                     Shown(request->repository_name()), "'"));
  }
  if (status.ok()) {
    const bool draining = requests_->draining();
    for (const ServedModel* m : *models) {
      if (request->ready() && draining) continue;
      auto* index = response->add_models();
      index->set_name(m->name);
      index->set_version(kModelVersion);
      index->set_state(draining ? "UNAVAILABLE" : "READY");
      if (draining) index->set_reason("server is shutting down");
    }
  }
  reactor->Finish(wire::ToGrpcStatus(status));
  return reactor;
}

}  // namespace attention::server
