#include "server/requests/request_path.h"

#include <initializer_list>
#include <iostream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/checked_math.h"
#include "core/status_macros.h"
#include "server/batching/batch_runner.h"
#include "server/requests/identifiers.h"
#include "server/requests/model_choices.h"
#include "server/requests/wire_layout.h"

namespace attention::server {
namespace {

// a x b x ..., saturating at INT64_MAX instead of overflowing.
int64_t SaturatingProduct(std::initializer_list<int64_t> factors) {
  int64_t product = 1;
  for (int64_t f : factors) {
    if (!CheckedMul(product, f, &product)) return std::numeric_limits<int64_t>::max();
  }
  return product;
}

// NOT_FOUND naming the versions that serve.
absl::Status VersionNotFound(const ModelRepository& repository, const std::string& name,
                             int64_t version) {
  std::vector<int64_t> serving;
  for (const VersionState& v : repository.Index(name)) {
    if (v.state == "READY") serving.push_back(v.version);
  }
  return absl::NotFoundError(
      absl::StrCat("model_version: model '", Shown(name), "' has no version ", version,
                   " serving (serving: ", absl::StrJoin(serving, ", "), ")"));
}

}  // namespace

RequestPath::RequestPath(Metrics* metrics, ServiceOptions options, std::ostream* log)
    : metrics_(metrics),
      options_(std::move(options)),
      budget_(options_.max_inflight_bytes, metrics),
      log_(log != nullptr ? log : &std::cerr) {}

void RequestPath::Bind(const CallContext& call, PendingRequest* pending) {
  pending->deadline = call.deadline;
  pending->is_cancelled = call.is_cancelled;
}

absl::Status RequestPath::Tag(const CallContext& call, const ServedModel& model,
                              PendingRequest* pending) {
  Bind(call, pending);
  if (options_.authenticator == nullptr) return absl::OkStatus();  // One tenant.
  ASSIGN_OR_RETURN(std::shared_ptr<const Principal> caller, Authenticate(call));
  if (caller == nullptr) return absl::OkStatus();
  absl::Status rate = rates_.Take(*caller, pending->tokens());
  if (!rate.ok()) {
    if (model.metrics != nullptr && model.metrics->tenants != nullptr) {
      model.metrics->tenants->For(caller->name)->Refused(TenantRefusal::kRate);
    }
    return rate;
  }
  pending->tenant.id = caller->id;
  pending->tenant.name = caller->name;
  pending->tenant.weight = caller->weight;
  pending->tenant.owner = std::move(caller);  // Keeps id and name alive.
  return absl::OkStatus();
}

absl::Status RequestPath::CheckResponseSize(const ServedModel& model, const MhaInputs& in,
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
                       " bytes (batch x heads x queries x keys x 4), over the server's fixed "
                       "ceiling of ",
                       DynamicBatcher::kMaxBatchWeightsBytes,
                       ", which no flag raises; leave need_weights off, or send fewer or shorter "
                       "sequences"));
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
                     ", attn_weights ", weights_bytes, "), over the server's --max_message_bytes ",
                     options_.max_response_bytes,
                     in.need_weights ? "; leave need_weights off or send less per request"
                                     : "; send less per request"));
  }
  const int64_t working =
      BatchWorkingBytes(engine, c.batch, c.queries, c.keys, c.self_attention, in.need_weights);
  if (working > max_working) {
    // The flag takes at most kMaxBatchWeightsBytes (server_flags.cc): past
    // it no start-up value helps, so none is suggested.
    const int64_t most = DynamicBatcher::kMaxBatchWeightsBytes;
    return absl::ResourceExhaustedError(absl::StrCat(
        "request: computing it takes about ", working,
        " bytes of working memory (padded inputs, projections, attention buffers",
        in.need_weights ? ", weights" : "", "), over the server's limit of ", max_working,
        " per batch (--max_batch_working_bytes, at most ", most,
        "); send fewer or shorter sequences", in.need_weights ? " or leave need_weights off" : "",
        working <= most ? absl::StrCat(", or start the server with --max_batch_working_bytes=",
                                       working, " or more")
                        : std::string()));
  }
  return absl::OkStatus();
}

void RequestPath::SetRepository(ModelRepository* repository) { repository_.store(repository); }

void RequestPath::StartDraining() { draining_.store(true); }

bool RequestPath::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return inflight_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void RequestPath::Received() {
  metrics_->inflight_requests().Increment();
  absl::MutexLock lock(&mu_);
  ++inflight_;
}

void RequestPath::Answered(const ServedModel* model, const CallContext& call,
                           const absl::Status& status, absl::Time received) {
  if (model == nullptr) {
    Answered(nullptr, "", call, status, received);
  } else {
    Answered(model->metrics, model->name, call, status, received);
  }
}

void RequestPath::Answered(const ModelMetrics* metrics, absl::string_view name,
                           const CallContext& call, const absl::Status& status,
                           absl::Time received) {
  const Method method = call.method;
  if (metrics != nullptr) {
    metrics->CountRequest(method, status.code());
    const double seconds = absl::ToDoubleSeconds(absl::Now() - received);
    const bool infer = method == Method::kInfer || method == Method::kInferStream ||
                       method == Method::kModelInfer || method == Method::kModelStreamInfer ||
                       method == Method::kRestModelInfer;
    const bool append = method == Method::kAppend || method == Method::kSessionStream;
    if (infer) metrics->request_duration->Observe(seconds);
    if (append) metrics->append_duration->Observe(seconds);
    if (infer || append) metrics->stats->Answered(status.ok(), absl::Seconds(seconds));
  }
  if (!status.ok()) {
    log_.Failed(
        method, !name.empty() ? std::string(name) : call.leases->asked(),
        [&] { return CallerName(call); }, call.peer, status);
  }
  metrics_->inflight_requests().Decrement();
  absl::MutexLock lock(&mu_);
  --inflight_;
}

std::string RequestPath::CallerName(const CallContext& call) const {
  if (options_.authenticator == nullptr) return "-";
  if (!call.authorization) return "(no token)";
  // Only for a logged failure: hashing the token again is cheap enough.
  const absl::string_view value = *call.authorization;
  auto principal = options_.authenticator->Authenticate(&value);
  return principal.ok() && *principal != nullptr ? (*principal)->name : "(unknown token)";
}

absl::StatusOr<std::shared_ptr<const Principal>> RequestPath::Authenticate(
    const CallContext& call) const {
  if (options_.authenticator == nullptr) return nullptr;
  absl::string_view value;
  if (call.authorization) value = *call.authorization;
  auto principal = options_.authenticator->Authenticate(call.authorization ? &value : nullptr);
  if (!principal.ok()) metrics_->CountRefusal(principal.status().code());
  return principal;
}

absl::StatusOr<const ServedModel*> RequestPath::FindModel(const Principal* principal,
                                                          const std::string& name, int64_t version,
                                                          const CallContext* pin) const {
  const ModelRepository* repository = repository_.load();
  if (repository == nullptr) return absl::UnavailableError("server is not ready yet");
  RETURN_IF_ERROR(CheckIdentifier(name, "model"));
  if (pin != nullptr) pin->leases->Asked(name);
  auto found = [&](ModelRef m) -> absl::StatusOr<const ServedModel*> {
    if (version != 0 && m->version != version) {
      const std::string model_name = m->name;
      m = repository->Find(model_name, version);
      if (m == nullptr) return VersionNotFound(*repository, model_name, version);
    }
    if (pin != nullptr) pin->leases->Hold(m);
    return m.get();
  };
  if (name.empty() && principal != nullptr && !principal->all_models) {
    // The default among the caller's own models (the server's default when
    // it may use that, else its first served model by name), so that a
    // refusal never names a model the caller may not know of.
    ModelRef fallback = repository->Find(name);
    if (fallback != nullptr && principal->MayUse(fallback->name)) return found(fallback);
    for (const ModelRef& m : repository->Snapshot()) {
      if (principal->MayUse(m->name)) return found(m);
    }
    metrics_->CountRefusal(absl::StatusCode::kPermissionDenied);
    return absl::PermissionDeniedError(
        absl::StrCat("model: caller '", principal->name, "' may use no served model"));
  }
  ModelRef model = repository->Find(name);
  const std::string& shown = model != nullptr ? model->name : name;
  // A name with nothing serving: the models this caller may use, and the
  // closest (said alike whether the name is known, not to tell a caller
  // that may not use it).
  auto choices = [&] {
    if (model != nullptr) return std::string();
    std::vector<std::string> names;
    for (const ModelRef& m : repository->Snapshot()) {
      if (principal == nullptr || principal->MayUse(m->name)) names.push_back(m->name);
    }
    return ModelChoices(name, names);
  };
  if (principal != nullptr && !principal->MayUse(shown) &&
      (model != nullptr || !principal->all_models)) {
    metrics_->CountRefusal(absl::StatusCode::kPermissionDenied);
    return absl::PermissionDeniedError(absl::StrCat(
        "model: caller '", principal->name, "' may not use model '", Shown(shown), "'", choices()));
  }
  if (model == nullptr) {
    // No name: the default model (the caller may use every model here).
    const std::string& known = name.empty() ? repository->default_model() : name;
    if (repository->Known(known)) {
      const std::string why = repository->WhyNotServing(known);
      return absl::NotFoundError(absl::StrCat("model: ", name.empty() ? "the default model " : "",
                                              "'", Shown(known), "' has no version serving (",
                                              why.empty() ? "unloaded" : why, ")",
                                              name.empty() ? choices() : std::string()));
    }
    return absl::NotFoundError(absl::StrCat("model: '", Shown(name), "' is not served", choices()));
  }
  return found(std::move(model));
}

absl::StatusOr<std::vector<const ServedModel*>> RequestPath::VisibleModels(
    const CallContext& call) const {
  const ModelRepository* repository = repository_.load();
  if (repository == nullptr) return absl::UnavailableError("server is not ready yet");
  ASSIGN_OR_RETURN(std::shared_ptr<const Principal> principal, Authenticate(call));
  std::vector<const ServedModel*> visible;
  for (const ModelRef& m : repository->Snapshot()) {
    if (principal == nullptr || principal->MayUse(m->name)) {
      call.leases->Hold(m);
      visible.push_back(m.get());
    }
  }
  return visible;
}

absl::Status RequestPath::Admit(int64_t bytes) { return budget_.Admit(bytes); }

void RequestPath::Release(int64_t bytes) { budget_.Release(bytes); }

absl::StatusOr<std::shared_ptr<const Principal>> RequestPath::Gate(const CallContext& call) const {
  if (repository_.load() == nullptr) return absl::UnavailableError("server is not ready yet");
  if (draining_.load()) return absl::UnavailableError("server is shutting down");
  return Authenticate(call);
}

absl::StatusOr<const ServedModel*> RequestPath::Admissible(const CallContext& call,
                                                           const std::string& model,
                                                           std::shared_ptr<const Principal>* caller,
                                                           int64_t version) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Principal> principal, Gate(call));
  if (caller != nullptr) *caller = principal;
  return FindModel(principal.get(), model, version, &call);
}

absl::Status RequestPath::Finalize(std::unique_ptr<PendingRequest> pending, size_t id_bytes,
                                   std::shared_ptr<const void> keep_alive, const CallContext& call,
                                   Prepared* prepared) {
  // In the model's layout on the wire: (L, N, E) for batch_first=False ones.
  ASSIGN_OR_RETURN(pending->call, ValidateInWireLayout(*prepared->model->engine, pending->inputs,
                                                       &pending->sequence_first));
  RETURN_IF_ERROR(CheckResponseSize(*prepared->model, pending->inputs, pending->call, id_bytes,
                                    &prepared->response_bytes));
  pending->keep_alive = std::move(keep_alive);
  // Held by the call's leases since its lookup: the request now holds its own.
  pending->version_lease = prepared->model->shared_from_this();
  RETURN_IF_ERROR(Tag(call, *prepared->model, pending.get()));
  prepared->pending = std::move(pending);
  return absl::OkStatus();
}

absl::Status RequestPath::Submit(Prepared& prepared, int64_t request_bytes,
                                 std::function<void(RequestOutcome)> done,
                                 AdmissionHolder* holder) {
  ASSIGN_OR_RETURN(std::shared_ptr<Admission> held,
                   budget_.Take(request_bytes + prepared.response_bytes));
  // Held until the response is sent (by the holder) or answered.
  prepared.pending->done = [held, holder, done = std::move(done)](RequestOutcome outcome) mutable {
    if (holder != nullptr) holder->Hold(std::move(held));
    held.reset();
    done(std::move(outcome));
  };
  return prepared.model->batcher->Enqueue(std::move(prepared.pending));
}

absl::Status RequestPath::AuthorizeAdmin(const CallContext& call, const std::string& model) const {
  ASSIGN_OR_RETURN(std::shared_ptr<const Principal> principal, Authenticate(call));
  const TokenAuthenticator* admins = options_.admin_authenticator.get();
  if (admins == nullptr) {
    if (principal == nullptr) return absl::OkStatus();  // An open server.
    metrics_->CountRefusal(absl::StatusCode::kPermissionDenied);
    return absl::PermissionDeniedError(
        "model control: needs an admin token (--admin_tokens_file), and this server has none");
  }
  absl::string_view value;
  if (call.authorization) value = *call.authorization;
  auto admin = admins->Authenticate(call.authorization ? &value : nullptr);
  if (!admin.ok() || *admin == nullptr || !(*admin)->MayUse(model)) {
    metrics_->CountRefusal(absl::StatusCode::kPermissionDenied);
    return absl::PermissionDeniedError(absl::StrCat(
        "model control: caller '", principal != nullptr ? principal->name : "-",
        "' may not load or unload model '", Shown(model), "' (not in --admin_tokens_file)"));
  }
  return absl::OkStatus();
}

void RequestPath::ControlModel(const CallContext& call, const std::string& name, bool load,
                               std::function<void(const absl::Status&)> done) {
  ModelRepository* repository = repository_.load();
  absl::Status status = CheckIdentifier(name, "model_name");
  if (status.ok() && name.empty()) {
    status = absl::InvalidArgumentError("model_name: expected a model's name, got ''");
  }
  if (repository == nullptr) status = absl::UnavailableError("server is not ready yet");
  if (status.ok() && draining_.load()) status = absl::UnavailableError("server is shutting down");
  if (status.ok() && repository->control() != ModelControl::kExplicit) {
    status = absl::FailedPreconditionError(absl::StrCat(
        "model control: this server runs with --model_control=",
        ModelControlName(repository->control()),
        "; loading and unloading on request needs --model_control=explicit",
        repository->control() == ModelControl::kPoll
            ? " (in poll mode the repository's folders decide, and a poll would undo it)"
            : ""));
  }
  if (status.ok()) status = AuthorizeAdmin(call, name);
  if (!status.ok()) {
    done(status);
    return;
  }
  // Queued behind other loads; a drain answers it UNAVAILABLE if it has not
  // started by then (ModelRepository::StopControl).
  auto answer = std::make_shared<std::function<void(const absl::Status&)>>(std::move(done));
  repository->Run(
      [repository, name, load, answer] {
        (*answer)(load ? repository->LoadModel(name) : repository->UnloadModel(name));
      },
      [name, load, answer] {
        (*answer)(absl::UnavailableError(absl::StrCat("server is shutting down: the ",
                                                      load ? "load" : "unload", " of model '", name,
                                                      "' was not started")));
      });
}

}  // namespace attention::server
