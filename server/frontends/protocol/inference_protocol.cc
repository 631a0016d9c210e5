#include "server/frontends/protocol/inference_protocol.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/status_macros.h"
#include "server/batching/outcome_flush.h"
#include "server/frontends/protocol/oip_model_info.h"
#include "server/frontends/protocol/sequence_sessions.h"
#include "server/requests/identifiers.h"

namespace attention::server {
InferenceProtocol::InferenceProtocol(RequestPath* requests, SequenceSessions* sequences,
                                     std::string version)
    : requests_(requests), sequences_(sequences), version_(std::move(version)) {}

absl::Status InferenceProtocol::AuthenticateProbe(const CallContext& call) const {
  if (!requests_->options().authenticate_health) return absl::OkStatus();
  return requests_->Authenticate(call).status();
}

bool InferenceProtocol::ServerReady() const {
  const ModelRepository* repository = requests_->repository();
  return repository != nullptr && !requests_->draining() && repository->AllServing();
}

void InferenceProtocol::ServerMetadata(inference::ServerMetadataResponse* response) const {
  response->set_name("attention-service");
  response->set_version(version_);
  // Triton's extension names for what is really supported: request
  // parameters, configuration, statistics, and (with sessions) sequences.
  response->add_extensions("parameters");
  response->add_extensions("model_configuration");
  response->add_extensions("statistics");
  response->add_extensions("model_repository");
  if (sequences_ != nullptr) response->add_extensions("sequence");
}

absl::StatusOr<const ServedModel*> InferenceProtocol::Model(
    const CallContext& call, const std::string& name, const std::string& version,
    std::shared_ptr<const Principal>* caller, bool* stateful) {
  ASSIGN_OR_RETURN(const int64_t number, ParseVersion(version));
  absl::StatusOr<const ServedModel*> found = requests_->Admissible(call, name, caller, number);
  const bool unknown = found.status().code() == absl::StatusCode::kNotFound ||
                       found.status().code() == absl::StatusCode::kPermissionDenied;
  if (unknown && sequences_ != nullptr && absl::EndsWith(name, kSequenceSuffix)) {
    auto base = requests_->Admissible(call, name.substr(0, name.size() - kSequenceSuffix.size()),
                                      caller, number);
    if (base.ok()) {
      found = base;
      if (stateful != nullptr) *stateful = true;
    }
  }
  return found;
}

absl::StatusOr<int64_t> InferenceProtocol::ParseVersion(const std::string& version) {
  RETURN_IF_ERROR(CheckIdentifier(version, "model_version"));
  if (version.empty()) return 0;
  int64_t number = 0;
  if (version[0] == '0' || !std::all_of(version.begin(), version.end(), ::isdigit) ||
      !absl::SimpleAtoi(version, &number)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_version: expected a version number (1, 2, ...) or '' for the newest, got '",
        Shown(version), "'"));
  }
  return number;
}

void InferenceProtocol::Relabel(const RequestOutcome& outcome,
                                inference::ModelInferResponse* response) {
  if (outcome.model_version > 0) response->set_model_version(std::to_string(outcome.model_version));
}

void InferenceProtocol::Label(const inference::ModelInferRequest& request, const ServedModel* model,
                              inference::ModelInferResponse* response) {
  // The stateful alias is echoed as asked.
  const bool alias = model != nullptr && request.model_name() == SequenceAlias(model->name);
  response->set_model_name(model != nullptr && !alias ? model->name : request.model_name());
  response->set_model_version(model != nullptr ? std::to_string(model->version) : "");
  response->set_id(Echoed(request.id()));
}

absl::Status InferenceProtocol::ModelReady(const CallContext& call, const std::string& name,
                                           const std::string& version, bool* ready) {
  *ready = false;
  if (requests_->draining()) return absl::OkStatus();  // Not ready; not an error.
  RETURN_IF_ERROR(Model(call, name, version).status());
  *ready = true;
  return absl::OkStatus();
}

absl::Status InferenceProtocol::ModelMetadata(const CallContext& call,
                                              const inference::ModelMetadataRequest& request,
                                              inference::ModelMetadataResponse* response) {
  bool stateful = false;
  ASSIGN_OR_RETURN(const ServedModel* model,
                   Model(call, request.name(), request.version(), nullptr, &stateful));
  // The alias keeps its own name: tools address requests by it.
  DescribeModelMetadata(*model, stateful ? request.name() : model->name, stateful, response);
  response->clear_versions();  // The serving versions.
  for (const VersionState& v : requests_->repository()->Index(model->name)) {
    if (v.state == "READY") response->add_versions(std::to_string(v.version));
  }
  return absl::OkStatus();
}

absl::Status InferenceProtocol::ModelConfig(const CallContext& call,
                                            const inference::ModelConfigRequest& request,
                                            inference::ModelConfigResponse* response) {
  bool stateful = false;
  ASSIGN_OR_RETURN(const ServedModel* model,
                   Model(call, request.name(), request.version(), nullptr, &stateful));
  std::optional<absl::Duration> idle;
  if (stateful) idle = sequences_->IdleTimeout(model);
  DescribeModelConfig(*model, stateful ? request.name() : model->name, idle,
                      response->mutable_config());
  return absl::OkStatus();
}

absl::Status InferenceProtocol::ModelStatistics(const CallContext& call,
                                                const inference::ModelStatisticsRequest& request,
                                                inference::ModelStatisticsResponse* response) {
  if (!request.name().empty()) {
    bool stateful = false;
    ASSIGN_OR_RETURN(const ServedModel* model,
                     Model(call, request.name(), request.version(), nullptr, &stateful));
    DescribeModelStatistics(*model, stateful ? request.name() : model->name,
                            std::to_string(model->version), response->add_model_stats());
    return absl::OkStatus();
  }
  // Every model the caller may use (statistics are the model's, across versions).
  ASSIGN_OR_RETURN(std::vector<const ServedModel*> models, requests_->VisibleModels(call));
  ASSIGN_OR_RETURN(const int64_t version, ParseVersion(request.version()));
  for (const ServedModel* m : models) {
    if (version != 0 && requests_->repository()->Find(m->name, version) == nullptr) continue;
    DescribeModelStatistics(*m, m->name, std::to_string(version != 0 ? version : m->version),
                            response->add_model_stats());
  }
  return absl::OkStatus();
}

absl::Status InferenceProtocol::RepositoryIndex(const CallContext& call,
                                                const inference::RepositoryIndexRequest& request,
                                                inference::RepositoryIndexResponse* response) {
  ASSIGN_OR_RETURN(std::vector<const ServedModel*> models, requests_->VisibleModels(call));
  ASSIGN_OR_RETURN(std::shared_ptr<const Principal> principal, requests_->Authenticate(call));
  if (!request.repository_name().empty()) {
    return absl::NotFoundError(
        absl::StrCat("repository_name: this server has one repository (leave it empty), got '",
                     Shown(request.repository_name()), "'"));
  }
  const bool draining = requests_->draining();
  for (const VersionState& v : requests_->repository()->Index()) {
    if (principal != nullptr && !principal->MayUse(v.model)) continue;
    const bool ready = v.state == "READY" && !draining;
    if (request.ready() && !ready) continue;
    auto* index = response->add_models();
    index->set_name(v.model);
    if (v.version > 0) index->set_version(std::to_string(v.version));
    index->set_state(ready ? "READY" : "UNAVAILABLE");
    index->set_reason(draining ? "server is shutting down" : v.reason);
  }
  return absl::OkStatus();
}

absl::Status InferenceProtocol::RepositoryControlAndWait(const CallContext& call,
                                                         const std::string& model_name,
                                                         const absl::StatusOr<int>& parameters,
                                                         bool load) {
  if (!parameters.ok()) return parameters.status();
  absl::Notification done;
  absl::Status outcome;
  RepositoryControl(call, "", model_name, *parameters, load, [&](const absl::Status& status) {
    outcome = status;
    done.Notify();
  });
  done.WaitForNotification();
  return outcome;
}

void InferenceProtocol::RepositoryControl(const CallContext& call,
                                          const std::string& repository_name,
                                          const std::string& model_name, int parameters, bool load,
                                          std::function<void(const absl::Status&)> done) {
  if (!repository_name.empty()) {
    done(absl::NotFoundError(
        absl::StrCat("repository_name: this server has one repository (leave it empty), got '",
                     Shown(repository_name), "'")));
    return;
  }
  if (parameters > 0) {
    done(absl::InvalidArgumentError(absl::StrCat(
        "parameters: none are accepted (a model loads from its folder), got ", parameters)));
    return;
  }
  requests_->ControlModel(call, model_name, load, std::move(done));
}

absl::Status InferenceProtocol::Prepare(const inference::ModelInferRequest& request,
                                        OipRequest decoded, std::shared_ptr<const void> keep_alive,
                                        const CallContext& call, RequestPath::Prepared* prepared) {
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

void InferenceProtocol::Infer(CallRef call, const inference::ModelInferRequest& request,
                              inference::ModelInferResponse* response, AdmissionHolder* holder,
                              std::function<void(const absl::Status&)> finish) {
  const absl::Time received = absl::Now();
  requests_->Received();
  // Written before the request is queued, so `done` (from the batcher)
  // reads it set.
  auto served = std::make_shared<const ServedModel*>(nullptr);
  auto answer = [this, received, served, call,
                 finish = std::move(finish)](const absl::Status& status) {
    requests_->Answered(*served, *call, status, received);
    finish(status);
  };
  const absl::Status status = Submit(call, request, static_cast<int64_t>(request.ByteSizeLong()),
                                     response, holder, answer, served.get());
  if (!status.ok()) answer(status);
}

absl::Status InferenceProtocol::Submit(CallRef call, const inference::ModelInferRequest& request,
                                       int64_t request_bytes,
                                       inference::ModelInferResponse* response,
                                       AdmissionHolder* holder,
                                       std::function<void(const absl::Status&)> done,
                                       const ServedModel** model, OutcomeFlush* flush) {
  std::shared_ptr<const Principal> caller;
  const absl::StatusOr<const ServedModel*> found =
      Model(*call, request.model_name(), request.model_version(), &caller);
  absl::StatusOr<OipRequest> decoded =
      found.ok() ? DecodeModelInfer(request) : absl::StatusOr<OipRequest>(found.status());
  const ServedModel* served = found.ok() ? *found : nullptr;
  *model = served;
  Label(request, served, response);
  RETURN_IF_ERROR(decoded.status());
  RETURN_IF_ERROR(CheckIdentifier(request.id(), "id"));
  const int64_t max_bytes = requests_->options().max_response_bytes;
  std::vector<OipOutput> outputs = decoded->outputs;
  const bool step = decoded->sequence_id.has_value();
  std::function<void(RequestOutcome)> encode =
      [response, done = std::move(done), outputs, max_bytes,
       flush = step ? flush : nullptr](RequestOutcome outcome) {
        Relabel(outcome, response);
        absl::Status result = outcome.status;
        if (result.ok()) result = EncodeModelInfer(outcome, outputs, max_bytes, response);
        done(result);
        // (The call may be gone now: `flush` outlives it.)
        if (flush != nullptr) flush->Flush();
      };
  if (step) {
    if (sequences_ == nullptr) {
      return absl::UnimplementedError("parameters['sequence_id']: this server has no sessions");
    }
    return sequences_->Submit(*call, request, *std::move(decoded), served, caller.get(), nullptr,
                              std::move(encode), holder);
  }
  RequestPath::Prepared prepared;
  prepared.model = served;
  RETURN_IF_ERROR(Prepare(request, *std::move(decoded), nullptr, *call, &prepared));
  prepared.pending->flush = flush;
  return requests_->Submit(prepared, request_bytes, std::move(encode), holder);
}

}  // namespace attention::server
