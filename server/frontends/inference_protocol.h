// File: server/frontends/inference_protocol.h
//
// InferenceProtocol: the Open Inference Protocol (KServe v2, with Triton's
// extensions) on its own messages, independent of the transport. The gRPC
// service (inference_service) and the REST front-end (rest_frontend) both
// translate their calls into these operations, so a model, a version, a
// stateful alias, an input or a sequence means the same on either, and is
// refused with the same status and message.
//
// Model names: a served model's own name, or, with sessions, its stateful
// alias "<model>_sequence" (Triton's tools see sequence batching there).
// Every model has the one version "1"; "" means it.
//
// Thread-safe. The request path and the sequences (when given) must outlive
// it.
#ifndef ATTENTION_SERVER_FRONTENDS_INFERENCE_PROTOCOL_H_
#define ATTENTION_SERVER_FRONTENDS_INFERENCE_PROTOCOL_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "inference/grpc_predict_v2.pb.h"
#include "server/frontends/oip_codec.h"
#include "server/requests/call_context.h"
#include "server/requests/request_path.h"

namespace attention::server {

class SequenceSessions;

class InferenceProtocol {
 public:
  // The one version every model has.
  static constexpr char kModelVersion[] = "1";

  // `version` is the server's, reported by ServerMetadata. `sequences` may
  // be null: sequence parameters are then UNIMPLEMENTED.
  InferenceProtocol(RequestPath* requests, SequenceSessions* sequences, std::string version);

  InferenceProtocol(const InferenceProtocol&) = delete;
  InferenceProtocol& operator=(const InferenceProtocol&) = delete;

  // Probes (ServerLive, ServerReady, ServerMetadata): OK, or with
  // --auth_probes the caller's UNAUTHENTICATED.
  absl::Status AuthenticateProbe(const CallContext& call) const;
  // Ready to serve: models loaded and not draining.
  bool ServerReady() const;
  void ServerMetadata(inference::ServerMetadataResponse* response) const;

  // OK with *ready (false while draining), or why the model is unknown.
  absl::Status ModelReady(const CallContext& call, const std::string& name,
                          const std::string& version, bool* ready);
  absl::Status ModelMetadata(const CallContext& call,
                             const inference::ModelMetadataRequest& request,
                             inference::ModelMetadataResponse* response);
  absl::Status ModelConfig(const CallContext& call, const inference::ModelConfigRequest& request,
                           inference::ModelConfigResponse* response);
  absl::Status ModelStatistics(const CallContext& call,
                               const inference::ModelStatisticsRequest& request,
                               inference::ModelStatisticsResponse* response);
  absl::Status RepositoryIndex(const CallContext& call,
                               const inference::RepositoryIndexRequest& request,
                               inference::RepositoryIndexResponse* response);

  // One unary inference, counted as received now: `finish` is called
  // exactly once (inline for a refused request, else from the batcher's
  // thread) with the outcome, after `response` is filled and the request
  // counted. `request` and `response` must outlive that call. The admitted
  // bytes are held by `holder` until it goes, when given.
  void Infer(CallRef call, const inference::ModelInferRequest& request,
             inference::ModelInferResponse* response, AdmissionHolder* holder,
             std::function<void(const absl::Status&)> finish);

  // The model `name` at `version` ("" or "1") for the caller of `call`.
  // With sessions, "<model>_sequence" names <model> as a stateful model
  // (*stateful set), unless a model has that name.
  absl::StatusOr<const ServedModel*> Model(const CallContext& call, const std::string& name,
                                           const std::string& version,
                                           std::shared_ptr<const Principal>* caller = nullptr,
                                           bool* stateful = nullptr);
  // A stateless request, decoded and validated into *prepared.
  absl::Status Prepare(const inference::ModelInferRequest& request, OipRequest decoded,
                       std::shared_ptr<const void> keep_alive, const CallContext& call,
                       RequestPath::Prepared* prepared);
  // Completes a response with the request's model, version and id.
  static void Label(const inference::ModelInferRequest& request, const ServedModel* model,
                    inference::ModelInferResponse* response);

  RequestPath* requests() const { return requests_; }
  SequenceSessions* sequences() const { return sequences_; }

 private:
  // NOT_FOUND naming `what` unless `version` is "" or the one version.
  static absl::Status CheckVersion(const std::string& what, const std::string& version);

  RequestPath* const requests_;
  SequenceSessions* const sequences_;
  const std::string version_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_INFERENCE_PROTOCOL_H_
