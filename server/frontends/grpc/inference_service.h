// File: server/frontends/grpc/inference_service.h
//
// inference.GRPCInferenceService: the Open Inference Protocol (KServe v2)
// and Triton's ModelStreamInfer, beside attention.v1 on the same port. Its
// requests take the same path as attention.v1's: authenticated, decoded and
// validated once (server/frontends/protocol/oip_codec.h), admitted against the in-flight byte
// budget, queued into the model's batcher (sharing batches with attention.v1
// requests), computed, encoded. Errors carry the same codes and messages.
// Sequence requests (Triton's sequence_id / sequence_start / sequence_end)
// append to a session (server/frontends/protocol/sequence_sessions.h).
//
// Each call is translated to InferenceProtocol's transport-neutral
// operations (server/frontends/protocol/inference_protocol.h), shared with the REST
// front-end. ModelInfer is a raw async method: AsyncInferQueue serves it
// (AsyncModelInferCall), as it serves attention.v1 Infer; the other methods
// are callbacks.
//
// Thread-safe. The protocol (and its request path and sequences) must
// outlive it.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_INFERENCE_SERVICE_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_INFERENCE_SERVICE_H_

#include <string>

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/frontends/grpc/stream_reactor.h"
#include "server/frontends/protocol/inference_protocol.h"
#include "server/frontends/protocol/oip_codec.h"
#include "server/requests/call_context.h"
#include "server/requests/identifiers.h"
#include "server/requests/request_path.h"

namespace attention::server {

// ModelStreamInfer's messages: the request's `id`; a failure in
// error_message, a result in infer_response.
template <>
struct StreamCodec<inference::ModelInferRequest, inference::ModelStreamInferResponse> {
  static const std::string& Id(const inference::ModelInferRequest& request) { return request.id(); }
  static void Complete(const std::string& id, const absl::Status& status,
                       inference::ModelStreamInferResponse* response) {
    if (!status.ok()) response->set_error_message(std::string(status.message().substr(0, 4096)));
    response->mutable_infer_response()->set_id(Echoed(id));
  }
};

namespace inference_service_internal {
using g = inference::GRPCInferenceService;
// Every method a callback but ModelInfer, which is raw (bytes, on a
// completion queue).
using Base = g::WithCallbackMethod_ServerLive<g::WithCallbackMethod_ServerReady<
    g::WithCallbackMethod_ModelReady<g::WithCallbackMethod_ServerMetadata<
        g::WithCallbackMethod_ModelMetadata<g::WithCallbackMethod_ModelStreamInfer<
            g::WithCallbackMethod_ModelConfig<g::WithCallbackMethod_ModelStatistics<
                g::WithCallbackMethod_RepositoryIndex<g::WithCallbackMethod_RepositoryModelLoad<
                    g::WithCallbackMethod_RepositoryModelUnload<
                        g::WithRawMethod_ModelInfer<g::Service>>>>>>>>>>>>;
}  // namespace inference_service_internal

class InferenceServiceImpl final : public inference_service_internal::Base {
 public:
  // Translates every call to `protocol`'s operations (which the REST
  // front-end shares); `protocol` must outlive it.
  explicit InferenceServiceImpl(InferenceProtocol* protocol);

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const inference::ServerLiveRequest* request,
                                       inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context,
                                        const inference::ServerReadyRequest* request,
                                        inference::ServerReadyResponse* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest* request,
                                           inference::ServerMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override;
  grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
  ModelStreamInfer(grpc::CallbackServerContext* context) override;
  // Triton's configuration, statistics and repository extensions.
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* context,
                                        const inference::ModelConfigRequest* request,
                                        inference::ModelConfigResponse* response) override;
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* context,
                                            const inference::ModelStatisticsRequest* request,
                                            inference::ModelStatisticsResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* context,
                                            const inference::RepositoryIndexRequest* request,
                                            inference::RepositoryIndexResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelLoad(
      grpc::CallbackServerContext* context, const inference::RepositoryModelLoadRequest* request,
      inference::RepositoryModelLoadResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelUnload(
      grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
      inference::RepositoryModelUnloadResponse* response) override;

 private:
  InferenceProtocol* const protocol_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_INFERENCE_SERVICE_H_
