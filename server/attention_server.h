// File: server/attention_server.h
//
// The whole serving stack in one object: metrics (and their HTTP exposer),
// the gRPC server with the attention service, health and reflection, and the
// model repository. attention-server's main() and the tests both use it.
//
//   ASSIGN_OR_RETURN(auto server, AttentionServer::Listen(options));  // NOT_SERVING
//   RETURN_IF_ERROR(server->LoadModels());                            // SERVING
//   ...
//   server->Drain();  // NOT_SERVING, UNAVAILABLE for new work, finish accepted, stop.
//
// Listen/LoadModels/Drain are called from one thread; the rest is thread-safe.
#ifndef ATTENTION_SERVER_ATTENTION_SERVER_H_
#define ATTENTION_SERVER_ATTENTION_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/batching/model_repository.h"
#include "server/frontends/grpc/async_infer_queue.h"
#include "server/frontends/grpc/attention_service.h"
#include "server/frontends/grpc/health_service.h"
#include "server/frontends/grpc/inference_service.h"
#include "server/frontends/grpc/reflection_service.h"
#include "server/frontends/grpc/session_service.h"
#include "server/frontends/protocol/inference_protocol.h"
#include "server/metrics/metrics.h"
#include "server/metrics/process_metrics.h"
#include "server/requests/request_path.h"
#include "server/security/tls_credentials.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_path.h"

namespace prometheus {
class Exposer;
}

namespace attention::server {

struct ServerOptions {
  std::string host = "0.0.0.0";  // Listen address for gRPC and metrics.
  int port = 50051;              // 0: a free port (see port()).
  int metrics_port = 9464;       // 0: no /metrics endpoint.
  // The KServe v2 REST port (RestFrontend), with the gRPC port's TLS and
  // tokens: -1 off (the library's default; the binary's --http_port is
  // 8000), 0 a free port (see http_port()).
  int http_port = -1;
  int http_io_threads = 2;          // REST's I/O threads (HttpServer).
  int http_max_connections = 1024;  // REST's open connections; one more: 503.
  int max_message_bytes = 64 << 20;
  // Threads that parse attention.v1 Infer requests larger than
  // AsyncInferCall::kInlineParseBytes (256 KiB), off the thread that
  // receives every Infer call (AsyncInferQueue); at least 1.
  int infer_parse_threads = 1;
  // Per InferStream: requests read but not yet answered and written, by
  // count and bytes, before the stream stops reading (ServiceOptions).
  int64_t max_stream_pending = 64;
  int64_t max_stream_pending_bytes = int64_t{256} << 20;
  absl::Duration drain_timeout = absl::Seconds(30);
  // A client connection is told to go away (GOAWAY) after this long, so that
  // clients open their new calls on a new connection and re-resolve the
  // service's name: replicas added by an autoscaler get their share. Zero:
  // connections live for ever. Calls already open on an aged connection (a
  // stream in use, a long call) may then run `connection_age_grace` more
  // before gRPC closes the connection under them; infinite by default, so
  // a stream is never cut for its connection's age (the drain's deadline
  // bounds every call at shutdown). Both are rounded to milliseconds; from
  // about 24.8 days (INT_MAX ms) on they mean no limit.
  absl::Duration max_connection_age = absl::Seconds(60);
  absl::Duration connection_age_grace = absl::InfiniteDuration();
  // After the last accepted request is answered, how long new ones are still
  // refused with UNAVAILABLE before the listener closes.
  absl::Duration drain_grace = absl::Milliseconds(500);
  RepositoryOptions repository;
  SessionOptions sessions;
  TlsOptions tls;  // Plaintext unless a certificate and key are given.
  // A file of SHA-256 token hashes and their models (TokenAuthenticator);
  // empty: no authentication.
  std::string auth_tokens_file;
  // Tokens that may load and unload models (same format); see
  // ServiceOptions::admin_authenticator.
  std::string admin_tokens_file;
  absl::Duration auth_reload_interval = absl::Seconds(2);
  // With tokens: health checks need one too (and reflection needs a token too).
  bool auth_probes = false;
  // Bytes of accepted, unanswered requests and their responses (see
  // ServiceOptions::max_inflight_bytes).
  int64_t max_inflight_bytes = int64_t{1} << 30;
  // Working memory of one computing batch (BatchingOptions::max_working_bytes);
  // 0: half of max_inflight_bytes, at least 16 MiB, at most 512 MiB.
  int64_t max_batch_working_bytes = 0;
  // gRPC's resource quota for buffers of messages being received; 0: twice
  // max_inflight_bytes (at least two largest messages). The memory plan
  // sets it.
  int64_t grpc_receive_quota_bytes = 0;
};

class RestFrontend;  // server/frontends/rest/rest_frontend.h (Beast stays out of this header)
class SequenceSessions;

class AttentionServer {
 public:
  // Starts listening with health NOT_SERVING and the service answering
  // UNAVAILABLE. Unavailable if a port cannot be bound.
  static absl::StatusOr<std::unique_ptr<AttentionServer>> Listen(const ServerOptions& options);

  // Drains if still serving.
  ~AttentionServer();

  // Loads and warms up the models, then reports SERVING (and again, after
  // each repository change, SERVING while every configured model has a
  // serving version). Errors from ModelRepository::Load.
  absl::Status LoadModels();

  // Reports NOT_SERVING, refuses new requests with UNAVAILABLE (and model
  // loads and unloads still queued), waits up to the drain timeout for
  // accepted ones and for a model load in progress (abandoned at the
  // timeout), then shuts the server down. True if every accepted request was
  // answered and no load was abandoned.
  bool Drain();

  // Model loads in progress stop at their next check (between chunks of
  // reading, before the engine, between warm-up passes) and fail with
  // UNAVAILABLE; later ones fail at once, so LoadModels returns promptly.
  // Thread-safe (a stop signal's thread calls it while LoadModels runs);
  // cannot be undone.
  void AbandonLoads() { abandon_loads_->store(true); }

  int port() const { return port_; }
  // The REST port; 0 when it is off.
  int http_port() const;  // 0 when the REST port is off.
  std::shared_ptr<grpc::Channel> InProcessChannel();
  Metrics& metrics() { return *metrics_; }
  // The request path every front-end calls (drain, the in-flight budget).
  RequestPath& service() { return *requests_; }
  // Null before LoadModels().
  ModelRepository* repository() { return repository_.get(); }
  SessionManager* sessions() { return sessions_.get(); }
  // attention.v1 Infer's queue (for tests: its parse pool).
  AsyncInferQueue& infer_queue() { return *infer_queue_; }

 private:
  explicit AttentionServer(const ServerOptions& options);
  void SetHealth(bool serving);

  const ServerOptions options_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<ProcessMetrics> process_metrics_ = std::make_shared<ProcessMetrics>();
  std::unique_ptr<RequestPath> requests_;
  std::unique_ptr<SessionPath> session_path_;
  std::unique_ptr<AttentionServiceImpl> service_;
  std::unique_ptr<SessionServiceImpl> session_service_;
  std::unique_ptr<SequenceSessions> sequences_;
  std::unique_ptr<InferenceProtocol> inference_protocol_;
  std::unique_ptr<InferenceServiceImpl> inference_service_;
  std::unique_ptr<HealthServiceImpl> health_service_;
  std::unique_ptr<ReflectionServiceV1> reflection_v1_;
  std::unique_ptr<ReflectionServiceV1Alpha> reflection_v1alpha_;
  std::unique_ptr<TlsIdentityWatcher> tls_identity_;  // Null for plaintext; outlives server_.
  // Infer on the async API. Outlives server_ (its completion queue) and the
  // repository (batchers name it as their requests' OutcomeFlush); stopped
  // by Drain.
  std::unique_ptr<AsyncInferQueue> infer_queue_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<RestFrontend> rest_;  // Null when the REST port is off.
  // Destroyed in dependency order (Drain, else members in reverse): the
  // session manager, which reads the models, before the repository.
  std::unique_ptr<ModelRepository> repository_;
  std::unique_ptr<SessionManager> sessions_;
  // The manager the repository's hooks (on_load, on_unload, on_freed) use,
  // null before it exists and once the drain lets it go: each hook holds
  // hooks_mu_ while it uses it, so the drain never destroys it under one
  // (on_freed runs on the version reaper's thread, whenever a lease goes).
  absl::Mutex hooks_mu_;
  SessionManager* hooked_sessions_ ABSL_GUARDED_BY(hooks_mu_) = nullptr;
  // Shared with the repository (RepositoryOptions::abandon).
  std::shared_ptr<std::atomic<bool>> abandon_loads_ = std::make_shared<std::atomic<bool>>(false);
  int port_ = 0;
  bool drained_ = false;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_ATTENTION_SERVER_H_
