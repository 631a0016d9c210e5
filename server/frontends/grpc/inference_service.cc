#include "server/frontends/grpc/inference_service.h"

#include <utility>
#include <vector>

#include "proto/codec/status_codes.h"
#include "server/frontends/grpc/grpc_call.h"
#include "server/frontends/protocol/sequence_sessions.h"

namespace attention::server {
namespace {

// A unary reaction that is already decided.
grpc::ServerUnaryReactor* Finished(grpc::CallbackServerContext* context,
                                   const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(wire::ToGrpcStatus(status));
  return reactor;
}

}  // namespace

InferenceServiceImpl::InferenceServiceImpl(InferenceProtocol* protocol) : protocol_(protocol) {}

grpc::ServerUnaryReactor* InferenceServiceImpl::ServerLive(
    grpc::CallbackServerContext* context, const inference::ServerLiveRequest*,
    inference::ServerLiveResponse* response) {
  const absl::Status status = protocol_->AuthenticateProbe(*CallOf(context, Method::kModelInfer));
  if (status.ok()) response->set_live(true);
  return Finished(context, status);
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ServerReady(
    grpc::CallbackServerContext* context, const inference::ServerReadyRequest*,
    inference::ServerReadyResponse* response) {
  const absl::Status status = protocol_->AuthenticateProbe(*CallOf(context, Method::kModelInfer));
  if (status.ok()) response->set_ready(protocol_->ServerReady());
  return Finished(context, status);
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  const absl::Status status = protocol_->AuthenticateProbe(*CallOf(context, Method::kModelInfer));
  if (status.ok()) protocol_->ServerMetadata(response);
  return Finished(context, status);
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ModelReady(
    grpc::CallbackServerContext* context, const inference::ModelReadyRequest* request,
    inference::ModelReadyResponse* response) {
  bool ready = false;
  const absl::Status status = protocol_->ModelReady(*CallOf(context, Method::kModelInfer),
                                                    request->name(), request->version(), &ready);
  response->set_ready(ready);
  return Finished(context, status);
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  return Finished(
      context, protocol_->ModelMetadata(*CallOf(context, Method::kModelInfer), *request, response));
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ModelConfig(
    grpc::CallbackServerContext* context, const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  return Finished(
      context, protocol_->ModelConfig(*CallOf(context, Method::kModelInfer), *request, response));
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ModelStatistics(
    grpc::CallbackServerContext* context, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  return Finished(context, protocol_->ModelStatistics(*CallOf(context, Method::kModelInfer),
                                                      *request, response));
}

grpc::ServerUnaryReactor* InferenceServiceImpl::RepositoryIndex(
    grpc::CallbackServerContext* context, const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  return Finished(context, protocol_->RepositoryIndex(*CallOf(context, Method::kModelInfer),
                                                      *request, response));
}

grpc::ServerUnaryReactor* InferenceServiceImpl::RepositoryModelLoad(
    grpc::CallbackServerContext* context, const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  protocol_->RepositoryControl(
      *CallOf(context, Method::kModelInfer), request->repository_name(), request->model_name(),
      request->parameters_size(), /*load=*/true,
      [reactor](const absl::Status& status) { reactor->Finish(wire::ToGrpcStatus(status)); });
  return reactor;
}

grpc::ServerUnaryReactor* InferenceServiceImpl::RepositoryModelUnload(
    grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  protocol_->RepositoryControl(
      *CallOf(context, Method::kModelInfer), request->repository_name(), request->model_name(),
      request->parameters_size(), /*load=*/false,
      [reactor](const absl::Status& status) { reactor->Finish(wire::ToGrpcStatus(status)); });
  return reactor;
}

grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
InferenceServiceImpl::ModelStreamInfer(grpc::CallbackServerContext* context) {
  using Reactor = StreamReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>;
  return new Reactor(
      protocol_->requests(), context, Method::kModelStreamInfer,
      [this](std::shared_ptr<inference::ModelInferRequest> request, const CallContext& call) {
        Reactor::Prepared out;
        auto prepared = std::make_shared<RequestPath::Prepared>();
        std::shared_ptr<const Principal> caller;
        absl::StatusOr<const ServedModel*> model =
            protocol_->Model(call, request->model_name(), request->model_version(), &caller);
        absl::StatusOr<OipRequest> decoded =
            model.ok() ? DecodeModelInfer(*request) : absl::StatusOr<OipRequest>(model.status());
        out.model = model.ok() ? *model : nullptr;
        out.status = decoded.status();
        if (out.status.ok()) out.status = CheckIdentifier(request->id(), "id");
        if (!out.status.ok()) return out;
        if (decoded->sequence_id) {
          // A sequence's steps on one stream are queued in the order read.
          if (protocol_->sequences() == nullptr) {
            out.status =
                absl::UnimplementedError("parameters['sequence_id']: this server has no sessions");
            return out;
          }
          const std::vector<OipOutput> outputs = decoded->outputs;
          auto step = protocol_->sequences()->Prepare(call, *request, *std::move(decoded),
                                                      out.model, caller.get(), request);
          out.status = step.status();
          if (!step.ok()) return out;
          out.response_bytes = SequenceSessions::ResponseBytes(**step);
          const int64_t max_bytes = protocol_->requests()->options().max_response_bytes;
          const ServedModel* served = out.model;
          out.submit = [sequences = protocol_->sequences(), step = *std::move(step), outputs,
                        max_bytes, served, request](Reactor::Reply reply, Admission* admission) {
            return sequences->Commit(
                step, admission,
                [reply, outputs, max_bytes, served, request](RequestOutcome outcome) {
                  inference::ModelStreamInferResponse response;
                  absl::Status result = outcome.status;
                  inference::ModelInferResponse* infer = response.mutable_infer_response();
                  InferenceProtocol::Label(*request, served, infer);
                  InferenceProtocol::Relabel(outcome, infer);
                  if (result.ok()) result = EncodeModelInfer(outcome, outputs, max_bytes, infer);
                  reply(std::move(response), result);
                });
          };
          return out;
        }
        const std::vector<OipOutput> outputs = decoded->outputs;
        prepared->model = out.model;
        out.status =
            protocol_->Prepare(*request, *std::move(decoded), request, call, prepared.get());
        out.response_bytes = prepared->response_bytes;
        const int64_t max_bytes = protocol_->requests()->options().max_response_bytes;
        const ServedModel* served = out.model;
        out.submit = [prepared, outputs, max_bytes, served, request](Reactor::Reply reply,
                                                                     Admission*) {
          prepared->pending->done = [reply, outputs, max_bytes, served,
                                     request](RequestOutcome outcome) {
            inference::ModelStreamInferResponse response;
            absl::Status result = outcome.status;
            inference::ModelInferResponse* infer = response.mutable_infer_response();
            InferenceProtocol::Label(*request, served, infer);
            if (result.ok()) result = EncodeModelInfer(outcome, outputs, max_bytes, infer);
            reply(std::move(response), result);
          };
          return prepared->model->batcher->Enqueue(std::move(prepared->pending));
        };
        return out;
      });
}

}  // namespace attention::server
