// File: server/frontends/grpc/attention_service.h
//
// The attention.v1.AttentionService front-end: InferStream, ListModels,
// GetModel, LoadModel and UnloadModel on gRPC's callback API, and Infer, the
// hot path, on its async API (driven by an AsyncInferQueue, which calls
// Prepare). It only translates: a handler decodes its message into a
// PendingRequest and hands it to the request path (admission, the batcher);
// the batch's completion, on the model's batcher thread, encodes the
// response. No reaction blocks.
//
// Thread-safe. The request path must outlive the service.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_ATTENTION_SERVICE_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_ATTENTION_SERVICE_H_

#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/v1/attention.grpc.pb.h"
#include "server/requests/call_context.h"
#include "server/requests/request_path.h"

namespace attention::server {

// Infer async and raw (its request arrives as bytes, which the
// AsyncInferQueue parses where it chooses, and its response leaves as
// bytes, serialized by the batcher's thread), the rest callback. (Marking a
// callback method async keeps its callback handler, which gRPC then serves
// instead: the async one must be marked on the plain Service, below the
// callback ones.)
using AttentionServiceBase = v1::AttentionService::WithCallbackMethod_InferStream<
    v1::AttentionService::WithCallbackMethod_ListModels<
        v1::AttentionService::WithCallbackMethod_GetModel<
            v1::AttentionService::WithCallbackMethod_LoadModel<
                v1::AttentionService::WithCallbackMethod_UnloadModel<
                    v1::AttentionService::WithRawMethod_Infer<v1::AttentionService::Service>>>>>>;

class AttentionServiceImpl final : public AttentionServiceBase {
 public:
  explicit AttentionServiceImpl(RequestPath* path) : path_(path) {}

  grpc::ServerBidiReactor<v1::InferRequest, v1::InferResponse>* InferStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* context,
                                     const v1::GetModelRequest* request,
                                     v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* LoadModel(grpc::CallbackServerContext* context,
                                      const v1::LoadModelRequest* request,
                                      v1::LoadModelResponse* response) override;
  grpc::ServerUnaryReactor* UnloadModel(grpc::CallbackServerContext* context,
                                        const v1::UnloadModelRequest* request,
                                        v1::UnloadModelResponse* response) override;

  using Prepared = RequestPath::Prepared;

  // Authenticates the caller of `call`, then decodes and validates `request`
  // (kept alive by `keep_alive`) into *prepared, ready for its model's
  // batcher once `done` is set. Errors: UNAVAILABLE when not ready or
  // draining, UNAUTHENTICATED or PERMISSION_DENIED, NOT_FOUND for an unknown
  // model, INVALID_ARGUMENT for bad tensors or options, RESOURCE_EXHAUSTED
  // when the response (or the weights buffer computing it) would be too
  // large.
  absl::Status Prepare(const v1::InferRequest& request, std::shared_ptr<const void> keep_alive,
                       const CallContext& call, Prepared* prepared);
  // Prepare for a call the request path's Gate() already let in, as
  // `caller` (null without authentication): the same checks but the gate's.
  absl::Status PrepareGated(const v1::InferRequest& request, const Principal* caller,
                            const CallContext& call, Prepared* prepared);

 private:
  // Prepare's steps, the model found by `find`.
  absl::Status PrepareWith(const v1::InferRequest& request, std::shared_ptr<const void> keep_alive,
                           const CallContext& call, Prepared* prepared,
                           absl::FunctionRef<absl::StatusOr<const ServedModel*>()> find);

  RequestPath* const path_;
};

// Fills `response` from a computed outcome (output, weights, timing).
// RESOURCE_EXHAUSTED (and `response` cleared) when it would exceed
// `max_bytes` or memory runs out.
absl::Status EncodeOutcome(RequestOutcome& outcome, int64_t max_bytes, v1::InferResponse* response);

// A model's description as the API reports it: `model`'s version, and the
// state of every version `repository` knows of.
void DescribeModel(const ServedModel& model, bool is_default, const ModelRepository& repository,
                   v1::ModelInfo* info);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_ATTENTION_SERVICE_H_
