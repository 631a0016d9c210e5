#include "server/attention_server.h"

#include <algorithm>
#include <iostream>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/fused_attention.h"
#include "core/status_macros.h"
#include "prometheus/exposer.h"
#include "server/frontends/grpc/grpc_call.h"
#include "server/frontends/grpc/reflection_service.h"
#include "server/frontends/protocol/sequence_sessions.h"
#include "server/frontends/rest/rest_frontend.h"
#include "server/metrics/metrics_port.h"
#include "server/metrics/process_metrics.h"
#include "server/port_probe.h"
#include "server/sessions/session_batch_runner.h"

#ifndef ATTENTION_VERSION
#define ATTENTION_VERSION "dev"
#endif

namespace attention::server {
namespace {

constexpr char kServiceName[] = "attention.v1.AttentionService";
constexpr char kSessionServiceName[] = "attention.v1.SessionService";

// A duration as a gRPC channel argument in milliseconds: from INT_MAX on
// (infinite included) INT_MAX, which gRPC reads as no limit.
int GrpcMilliseconds(absl::Duration d) {
  if (d >= absl::Milliseconds(std::numeric_limits<int>::max())) {
    return std::numeric_limits<int>::max();
  }
  return static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(d)));
}

}  // namespace

AttentionServer::AttentionServer(const ServerOptions& options)
    : options_(options), metrics_(std::make_unique<Metrics>(ATTENTION_VERSION)) {}

absl::StatusOr<std::unique_ptr<AttentionServer>> AttentionServer::Listen(
    const ServerOptions& options) {
  // Busy ports are one clear line, before anything starts or is announced.
  RETURN_IF_ERROR(CheckPortFree(options.host, options.port, "port"));
  if (options.metrics_port > 0) {
    RETURN_IF_ERROR(CheckPortFree(options.host, options.metrics_port, "metrics_port"));
  }
  if (options.http_port > 0) {
    RETURN_IF_ERROR(CheckPortFree(options.host, options.http_port, "http_port"));
  }
  auto s = std::unique_ptr<AttentionServer>(new AttentionServer(options));
  if (options.metrics_port > 0) {
    const std::string address = absl::StrCat(options.host, ":", options.metrics_port);
    try {
      s->exposer_ = std::make_unique<prometheus::Exposer>(address, 2, MetricsPortCallbacks());
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
    }
    s->exposer_->RegisterCollectable(s->metrics_->registry());
    s->exposer_->RegisterCollectable(s->process_metrics_);
    std::cerr << "metrics on http://" << address << "/metrics\n";
  }
  ASSIGN_OR_RETURN(ServerTransport transport, MakeServerTransport(options.tls));
  s->tls_identity_ = std::move(transport.identity);
  ServiceOptions service_options;
  service_options.max_response_bytes = options.max_message_bytes;
  service_options.max_stream_pending = options.max_stream_pending;
  service_options.max_stream_pending_bytes = options.max_stream_pending_bytes;
  service_options.max_inflight_bytes = options.max_inflight_bytes;
  service_options.max_batch_weights_bytes = options.repository.batching.max_batch_weights_bytes;
  service_options.authenticate_health = options.auth_probes;
  if (!options.auth_tokens_file.empty()) {
    ASSIGN_OR_RETURN(
        service_options.authenticator,
        TokenAuthenticator::Open(options.auth_tokens_file, options.auth_reload_interval,
                                 // Every caller authenticates here first, admins too: say so
                                 // (generically: nothing about whether the token is an admin's).
                                 options.admin_tokens_file.empty()
                                     ? ""
                                     : "an admin token must also be in --auth_tokens_file"));
    std::cerr << "authentication: " << service_options.authenticator->size()
              << " bearer token(s) from " << options.auth_tokens_file
              << (options.auth_probes ? " (health checks and reflection too)"
                                      : " (health and reflection open)")
              << "\n";
  } else if (options.auth_probes) {
    return absl::InvalidArgumentError("--auth_probes: needs --auth_tokens_file");
  }
  if (!options.admin_tokens_file.empty()) {
    ASSIGN_OR_RETURN(
        service_options.admin_authenticator,
        TokenAuthenticator::Open(options.admin_tokens_file, options.auth_reload_interval));
    std::cerr << "model control: " << service_options.admin_authenticator->size()
              << " admin token(s) from " << options.admin_tokens_file << "\n";
  }
  s->metrics_->inflight_bytes_limit().Set(static_cast<double>(options.max_inflight_bytes));
  // The protocol-neutral paths, then the front-ends that translate to them.
  s->requests_ = std::make_unique<RequestPath>(s->metrics_.get(), service_options);
  s->session_path_ = std::make_unique<SessionPath>(s->requests_.get());
  s->service_ = std::make_unique<AttentionServiceImpl>(s->requests_.get());
  s->session_service_ = std::make_unique<SessionServiceImpl>(s->session_path_.get());
  // The Open Inference Protocol, its sequences appended to sessions.
  s->sequences_ = std::make_unique<SequenceSessions>(s->session_path_.get());
  s->inference_protocol_ = std::make_unique<InferenceProtocol>(
      s->requests_.get(), s->sequences_.get(), ATTENTION_VERSION);
  s->inference_service_ = std::make_unique<InferenceServiceImpl>(s->inference_protocol_.get());
  // Every service the server registers, by full name: health reports on the
  // application services, reflection lists them all.
  std::vector<std::pair<std::string, grpc::Service*>> services = {
      {kServiceName, s->service_.get()},
      {kSessionServiceName, s->session_service_.get()},
      {inference::GRPCInferenceService::service_full_name(), s->inference_service_.get()},
  };
  // Health and reflection: open, or with --auth_probes behind the tokens.
  HealthServiceImpl::Authenticate probe_auth;
  if (options.auth_probes) {
    probe_auth = [requests = s->requests_.get()](const grpc::CallbackServerContext* context) {
      return requests
          ->Authenticate(*CallOf(const_cast<grpc::CallbackServerContext*>(context), Method::kInfer))
          .status();
    };
  }
  std::set<std::string> health_names;
  for (const auto& [name, service] : services) health_names.insert(name);
  s->health_service_ = std::make_unique<HealthServiceImpl>(health_names, probe_auth);
  grpc::EnableDefaultHealthCheckService(false);
  services.emplace_back(grpc::health::v1::Health::service_full_name(), s->health_service_.get());
  // Reflection lists these and itself (both versions).
  std::vector<std::string> names;
  for (const auto& [name, service] : services) names.push_back(name);
  s->reflection_v1_ = std::make_unique<ReflectionServiceV1>(names, probe_auth);
  s->reflection_v1alpha_ = std::make_unique<ReflectionServiceV1Alpha>(names, probe_auth);
  services.emplace_back(grpc::reflection::v1::ServerReflection::service_full_name(),
                        s->reflection_v1_.get());
  services.emplace_back(grpc::reflection::v1alpha::ServerReflection::service_full_name(),
                        s->reflection_v1alpha_.get());
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(options.host, ":", options.port);
  builder.AddListeningPort(address, transport.credentials, &s->port_);
  // gRPC sets SO_REUSEPORT by default, so a second server on the same port
  // would start and silently take half the connections (and half of every
  // client's sessions). Refuse to start instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // GOAWAY after the age stops new calls on the connection; the calls open on
  // it keep running for the grace (INT_MAX: gRPC's "no limit").
  if (options.max_connection_age > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               GrpcMilliseconds(options.max_connection_age));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               GrpcMilliseconds(options.connection_age_grace));
  }
  // gRPC's own buffers (messages being received, before the service can
  // refuse them) come from a quota: the memory plan's, or by default twice
  // the in-flight budget (at least two largest messages). Near the quota
  // gRPC refuses new streams (RESOURCE_EXHAUSTED) and, closer still, asks
  // clients to reconnect (GOAWAY).
  const int64_t quota = options.grpc_receive_quota_bytes > 0
                            ? options.grpc_receive_quota_bytes
                            : std::max<int64_t>(int64_t{2} * options.max_inflight_bytes,
                                                int64_t{2} * options.max_message_bytes);
  builder.SetResourceQuota(
      grpc::ResourceQuota("attention-server").Resize(static_cast<size_t>(quota)));
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  for (const auto& [name, service] : services) builder.RegisterService(service);
  // Infer's and ModelInfer's completion queue, driven by one thread
  // (AsyncInferQueue), and its threads that parse large requests.
  s->infer_queue_ = std::make_unique<AsyncInferQueue>(
      s->service_.get(), s->inference_service_.get(), s->inference_protocol_.get(),
      s->requests_.get(), builder.AddCompletionQueue(), options.infer_parse_threads);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  s->infer_queue_->Start();
  s->SetHealth(false);
  std::cerr << "listening on port " << s->port_ << " (" << DescribeTransport(options.tls)
            << "; health NOT_SERVING until models are ready)\n";
  if (options.http_port >= 0) {
    RestOptions rest;
    rest.host = options.host;
    rest.port = options.http_port;
    rest.io_threads = options.http_io_threads;
    rest.max_connections = options.http_max_connections;
    rest.max_body_bytes = options.max_message_bytes;
    rest.metrics_port = options.metrics_port;
    rest.receive_budget_bytes = quota;  // gRPC's receive quota's size, for REST's bodies.
    if (s->tls_identity_ != nullptr) {  // The pair in force, re-read as gRPC's is.
      rest.tls_identity_file = s->tls_identity_->path();
    } else {
      rest.tls_cert_file = options.tls.cert_file;
      rest.tls_key_file = options.tls.key_file;
    }
    rest.tls_client_ca_file = options.tls.client_ca_file;
    ASSIGN_OR_RETURN(s->rest_, RestFrontend::Start(s->inference_protocol_.get(), rest));
    std::cerr << "REST (KServe v2) on " << (s->rest_->tls() ? "https" : "http") << "://"
              << options.host << ":" << s->rest_->port() << "/v2\n";
  }
  return s;
}

int AttentionServer::http_port() const { return rest_ != nullptr ? rest_->port() : 0; }

AttentionServer::~AttentionServer() {
  if (!drained_) Drain();
}

void AttentionServer::SetHealth(bool serving) { health_service_->SetServing(serving); }

absl::Status AttentionServer::LoadModels() {
  RepositoryOptions r = options_.repository;
  // One batch's working memory is held beside the in-flight budget: at most
  // half of it by default, so that the two together stay within 1.5 budgets.
  if (options_.max_batch_working_bytes > 0) {
    r.batching.max_working_bytes = options_.max_batch_working_bytes;
  } else {
    r.batching.max_working_bytes =
        std::min(r.batching.max_working_bytes,
                 std::max<int64_t>(options_.max_inflight_bytes / 2, int64_t{16} << 20));
  }
  std::cerr << "batch working memory limit " << r.batching.max_working_bytes << " bytes\n";
  std::cerr << "loading models from "
            << (r.path.empty() ? std::string("the built-in demo") : r.path) << " ("
            << r.compute_threads << " compute threads, attention kernel " << AttentionPathName()
            << ")\n";
  // Versions loaded after start get their session state before they serve;
  // those unloaded end their sessions.
  r.on_load = [this](ServedModel& m) {
    absl::MutexLock lock(&hooks_mu_);
    if (hooked_sessions_ == nullptr) return;
    hooked_sessions_->AddModel(&m);
    InstallSessionRunner(*hooked_sessions_, m);
  };
  r.on_unload = [this](const ServedModel& m) {
    absl::MutexLock lock(&hooks_mu_);
    if (hooked_sessions_ != nullptr) hooked_sessions_->RemoveModel(&m);
  };
  r.on_freed = [this](const void* key) {
    absl::MutexLock lock(&hooks_mu_);
    if (hooked_sessions_ != nullptr) hooked_sessions_->ForgetModel(key);
  };
  r.abandon = abandon_loads_;
  r.on_change = [this] {
    const ModelRepository* repository = requests_->repository();
    if (repository != nullptr && !requests_->draining()) SetHealth(repository->AllServing());
  };
  std::cerr << "model control: " << ModelControlName(r.control);
  if (r.control == ModelControl::kPoll) {
    std::cerr << " (every " << absl::FormatDuration(r.poll_interval) << ")";
  }
  std::cerr << "\n";
  ASSIGN_OR_RETURN(repository_, ModelRepository::Load(r, metrics_.get()));
  sessions_ =
      std::make_unique<SessionManager>(repository_.get(), metrics_.get(), options_.sessions);
  InstallSessionRunners(*sessions_, *repository_);
  {
    absl::MutexLock lock(&hooks_mu_);
    hooked_sessions_ = sessions_.get();
  }
  session_path_->SetManager(sessions_.get());
  requests_->SetRepository(repository_.get());
  SetHealth(true);
  std::cerr << "ready: serving " << repository_->models().size() << " model(s), default '"
            << repository_->default_model() << "'"
            << (repository_->Find("") == nullptr ? " (not serving: requests naming no model are "
                                                   "refused until it does)"
                                                 : "");
  std::vector<std::string> failed;
  for (const VersionState& v : repository_->Index()) {
    if (repository_->Find(v.model) == nullptr && (failed.empty() || failed.back() != v.model)) {
      failed.push_back(v.model);
    }
  }
  if (!failed.empty()) {
    std::cerr << "; not serving " << failed.size()
              << " that failed to load: " << absl::StrJoin(failed, ", ")
              << " (see the repository index)";
  }
  std::cerr << "\n";
  return absl::OkStatus();
}

bool AttentionServer::Drain() {
  drained_ = true;
  if (server_ == nullptr) return true;  // Listen failed: nothing started.
  // Draining first: a load or poll finishing now must not report SERVING
  // again (on_change sets health only while not draining).
  requests_->StartDraining();
  SetHealth(false);
  if (sessions_ != nullptr) sessions_->StopAccepting();
  if (repository_ != nullptr) {
    // No load, unload or poll starts from here on: queued loads are answered
    // UNAVAILABLE now; one in progress has until the drain deadline.
    repository_->StopControl();
    repository_->StopAccepting();
  }
  const absl::Time start = absl::Now();
  const bool idle = requests_->WaitIdle(options_.drain_timeout);
  if (!idle) std::cerr << "drain timeout: some accepted requests were not answered\n";
  const bool loads_done =
      repository_ == nullptr || repository_->FinishControl(start + options_.drain_timeout);
  if (repository_ != nullptr) repository_->StopAccepting();  // A version a load just published.
  // Keep answering UNAVAILABLE for a moment so that clients still sending see
  // a clear refusal (and go elsewhere) rather than calls cut by the shutdown
  // (not needed before any model served: nothing was routed here).
  if (repository_ != nullptr) {
    absl::SleepFor(std::min(options_.drain_grace, options_.drain_timeout - (absl::Now() - start)));
  }
  // Calls still open (streams the client keeps open) get what is left of the
  // drain timeout, then are cancelled.
  const absl::Duration left =
      std::max(absl::ZeroDuration(), start + options_.drain_timeout - absl::Now());
  // REST's connections: closed after their answer, and at the drain's end
  // whatever they do (their requests cancelled).
  // One deadline for both ports: what REST took of it is not given again.
  const absl::Time end = absl::Now() + left;
  if (rest_ != nullptr) rest_->Stop(left);
  server_->Shutdown(absl::ToChronoTime(std::max(absl::Now(), end)));
  server_->Wait();
  // Infer's calls still open were cancelled by the shutdown: their batchers
  // drop them, the queue answers them, then its completion queue drains.
  infer_queue_->Stop();
  // gRPC may still be running a call's OnDone, which drops the call's hold on
  // the in-flight budget, on one of its threads: the budget (and the metrics
  // it updates) must stay until every hold is gone.
  if (!requests_->budget().WaitReleased(absl::Now() + absl::Seconds(5))) {
    std::cerr << "drain: " << requests_->budget().used()
              << " in-flight bytes still held 5 s after shutdown\n";
  }
  // Dependency order: the session manager first (its reaper ends expired
  // sessions, reading their models), then the models. Every call has ended,
  // and a call ends only after its batcher work answered, so no batcher holds
  // session work any more.
  {
    absl::MutexLock lock(&hooks_mu_);  // Waits for a hook using it (a late on_freed).
    hooked_sessions_ = nullptr;
  }
  sessions_.reset();
  repository_.reset();
  return idle && loads_done;
}

std::shared_ptr<grpc::Channel> AttentionServer::InProcessChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  args.SetMaxSendMessageSize(options_.max_message_bytes);
  return server_->InProcessChannel(args);
}

}  // namespace attention::server
