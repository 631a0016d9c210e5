// File: server/frontends/protocol/inference_protocol.h
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
// Versions: "" means the newest serving version, "N" version N (NOT_FOUND
// naming the serving ones when it does not serve); responses name the
// version that computed them.
//
// Thread-safe. The request path and the sequences (when given) must outlive
// it.
#ifndef ATTENTION_SERVER_FRONTENDS_PROTOCOL_INFERENCE_PROTOCOL_H_
#define ATTENTION_SERVER_FRONTENDS_PROTOCOL_INFERENCE_PROTOCOL_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "inference/grpc_predict_v2.pb.h"
#include "server/frontends/protocol/oip_codec.h"
#include "server/requests/call_context.h"
#include "server/requests/request_path.h"

namespace attention::server {

class OutcomeFlush;  // server/batching/outcome_flush.h

class SequenceSessions;

class InferenceProtocol {
 public:
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

  // Triton's RepositoryModelLoad (`load`) and RepositoryModelUnload: see
  // RequestPath::ControlModel; `parameters` is how many the request had
  // (none are accepted). `done` is called exactly once, maybe from the
  // repository's thread.
  void RepositoryControl(const CallContext& call, const std::string& repository_name,
                         const std::string& model_name, int parameters, bool load,
                         std::function<void(const absl::Status&)> done);
  // The same, waiting for the outcome: for callers on threads of their own
  // (REST's connection threads), never from a gRPC reaction. `parameters`:
  // how many the request had, or why they could not be read (answered as is).
  absl::Status RepositoryControlAndWait(const CallContext& call, const std::string& model_name,
                                        const absl::StatusOr<int>& parameters, bool load);

  // One unary inference, counted as received now: `finish` is called
  // exactly once (inline for a refused request, else from the batcher's
  // thread) with the outcome, after `response` is filled and the request
  // counted. `request` and `response` must outlive that call. The admitted
  // bytes are held by `holder` until it goes, when given.
  void Infer(CallRef call, const inference::ModelInferRequest& request,
             inference::ModelInferResponse* response, AdmissionHolder* holder,
             std::function<void(const absl::Status&)> finish);
  // Infer's steps after the count, for a front-end that counts requests
  // itself (AsyncModelInferCall): finds the model (into *model, for the
  // count, as soon as it is found), decodes, validates and submits the
  // request, admitted as `request_bytes`. OK: `done` gets the outcome's
  // status once, from the batcher's thread, after `response` is filled;
  // `request` and `response` must outlive that call. Else the refusal, and
  // `done` is never called. `flush` (optional) is flushed after `done`: once
  // per batch for a stateless request (PendingRequest::flush), after each
  // answer for a sequence step.
  absl::Status Submit(CallRef call, const inference::ModelInferRequest& request,
                      int64_t request_bytes, inference::ModelInferResponse* response,
                      AdmissionHolder* holder, std::function<void(const absl::Status&)> done,
                      const ServedModel** model, OutcomeFlush* flush = nullptr);

  // The model `name` at `version` ("": the newest serving) for the caller of
  // `call`, held by the call's leases.
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
  // Corrects the version for a sequence step, computed on its session's
  // version (RequestOutcome::model_version) rather than the one resolved.
  static void Relabel(const RequestOutcome& outcome, inference::ModelInferResponse* response);

  RequestPath* requests() const { return requests_; }
  SequenceSessions* sequences() const { return sequences_; }

 private:
  // 0 for "", else the number; INVALID_ARGUMENT for anything else.
  static absl::StatusOr<int64_t> ParseVersion(const std::string& version);

  RequestPath* const requests_;
  SequenceSessions* const sequences_;
  const std::string version_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_PROTOCOL_INFERENCE_PROTOCOL_H_
