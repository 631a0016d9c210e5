// File: server/requests/request_path.h
//
// RequestPath: the protocol-neutral path every front-end's requests take,
// in order: readiness and drain, the caller's identity (a bearer token),
// model lookup, validation against the model, the response-size and
// working-memory estimate, in-flight admission (and its release), the
// call's deadline and cancellation, submission to the model's batcher, and
// counting (metrics by method and code, the in-flight gauge, drain, the log
// line of a refused or failed request). It knows absl::Status, core types
// and the server's own request types; no protocol's messages.
//
// A front-end decodes its wire message into a PendingRequest, calls
// Admissible, Finalize and Submit (or the session path), and encodes the
// outcome; Received and Answered bracket every request.
//
// Thread-safe. The metrics, and the repository once set, must outlive it;
// the in-flight budget's Admissions must go before it does (see Drain in
// attention_server.cc).
#ifndef ATTENTION_SERVER_REQUESTS_REQUEST_PATH_H_
#define ATTENTION_SERVER_REQUESTS_REQUEST_PATH_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/batching/model_repository.h"
#include "server/batching/pending_request.h"
#include "server/metrics/metrics.h"
#include "server/requests/call_context.h"
#include "server/requests/inflight_budget.h"
#include "server/requests/request_log.h"
#include "server/requests/tenant_rates.h"
#include "server/security/token_authenticator.h"

namespace attention::server {

struct ServiceOptions {
  // Largest response message; a request whose response would be larger is
  // refused with RESOURCE_EXHAUSTED before it is computed.
  int64_t max_response_bytes = 64 << 20;
  // Per stream: requests read but whose responses are not yet written, by
  // count and by bytes (request plus estimated response). At either cap the
  // stream stops reading until the client reads responses, so a client that
  // never reads holds at most this much server memory.
  int64_t max_stream_pending = 64;
  int64_t max_stream_pending_bytes = int64_t{256} << 20;
  // Bytes of every request accepted and not yet answered, counting its
  // message and the response (output and weights) it will produce. A request
  // that would pass it is refused with RESOURCE_EXHAUSTED before anything
  // large is allocated; an admitted one is never dropped for memory.
  int64_t max_inflight_bytes = int64_t{1} << 40;
  // Largest float32 attention-weights buffer one request or batch may need
  // (the memory plan's value, inside max_inflight_bytes); the model's
  // batcher enforces the same value. At most
  // DynamicBatcher::kMaxBatchWeightsBytes.
  int64_t max_batch_weights_bytes = int64_t{512} << 20;
  // Null: no authentication, every caller may use every model. Else every
  // call must carry a known bearer token, and use only the token's models.
  std::shared_ptr<const TokenAuthenticator> authenticator;
  // Probes (health, and the inference protocol's ServerLive, ServerReady and
  // ServerMetadata) need a token too (when `authenticator` is set).
  bool authenticate_health = false;
  // Tokens that may load and unload models (--admin_tokens_file; an entry's
  // models are those it may load and unload). Null: with `authenticator`
  // set nobody may; without it (an open server) every caller may.
  std::shared_ptr<const TokenAuthenticator> admin_authenticator;
};

class RequestPath {
 public:
  // Requests get UNAVAILABLE ("not ready") until SetRepository(). Refused
  // and failed requests are logged to `log` (std::cerr when null).
  RequestPath(Metrics* metrics, ServiceOptions options, std::ostream* log = nullptr);

  RequestPath(const RequestPath&) = delete;
  RequestPath& operator=(const RequestPath&) = delete;

  // Makes the path ready to serve `repository`'s models.
  void SetRepository(ModelRepository* repository);
  // From now on every new request gets UNAVAILABLE; accepted ones complete.
  void StartDraining();
  // Waits until no accepted request is unanswered, or `timeout`. True if idle.
  bool WaitIdle(absl::Duration timeout);

  // A decoded, validated request and the model it is for.
  struct Prepared {
    const ServedModel* model = nullptr;  // Set once the model is found.
    std::unique_ptr<PendingRequest> pending;
    int64_t response_bytes = 0;  // Estimated size of the encoded response.
  };

  // The first steps of every protocol's request, which need only the call's
  // metadata (so a front-end may take them before it parses a message):
  // UNAVAILABLE when not ready or draining, then Authenticate (whose result
  // it returns).
  absl::StatusOr<std::shared_ptr<const Principal>> Gate(const CallContext& call) const;
  // Gate, then FindModel. Sets *caller (if given) to
  // the authenticated principal (null without authentication).
  // `version` 0 is the newest serving version; the version found is held by
  // the call's leases (valid until they go: see CallLeases).
  absl::StatusOr<const ServedModel*> Admissible(const CallContext& call, const std::string& model,
                                                std::shared_ptr<const Principal>* caller = nullptr,
                                                int64_t version = 0);
  // The last steps: validates `pending->inputs` against prepared->model in
  // the layout it takes (wire_layout.h: (L, N, E) for a batch_first=False
  // model, marking the request sequence_first), sizes the response
  // (RESOURCE_EXHAUSTED when too large), binds the call's deadline and
  // cancellation, and stores the request in *prepared.
  absl::Status Finalize(std::unique_ptr<PendingRequest> pending, size_t id_bytes,
                        std::shared_ptr<const void> keep_alive, const CallContext& call,
                        Prepared* prepared);
  // Admits a prepared unary request (its `request_bytes` and its response)
  // against the in-flight budget and queues it; `done` gets the outcome. The
  // bytes are held by `holder` (until the call is done) when given, else
  // released before `done`. OK: queued (`done` will be called); else the
  // error to answer with, and nothing stays admitted.
  absl::Status Submit(Prepared& prepared, int64_t request_bytes,
                      std::function<void(RequestOutcome)> done, AdmissionHolder* holder = nullptr);

  // Counts a request as received (in flight).
  void Received();
  // Counts a request of `call` as answered with `status`: metrics by method
  // and code, duration, the in-flight gauge, and (when not OK) the log line.
  // Unary front-ends call it just before they finish the call, so a client
  // that has its response also sees it counted.
  void Answered(const ServedModel* model, const CallContext& call, const absl::Status& status,
                absl::Time received);
  // The same for an answer counted after its version may be gone: the
  // model's `metrics` (null: none found) and `name`, which outlive it.
  void Answered(const ModelMetrics* metrics, absl::string_view name, const CallContext& call,
                const absl::Status& status, absl::Time received);

  // The caller of `call`: null when authentication is off (every model
  // allowed), else its principal; UNAUTHENTICATED (counted) when the call
  // carries no known token.
  absl::StatusOr<std::shared_ptr<const Principal>> Authenticate(const CallContext& call) const;
  // The served model `name` names for `principal` (null: authentication
  // off): PERMISSION_DENIED (counted) when the caller may not use it, which
  // for a caller limited to some models also hides whether it exists;
  // NOT_FOUND when it is not served, or has no serving `version` (0: the
  // newest). The version is held by `pin`'s leases when given; without one
  // the pointer may go as soon as the version is unloaded (use it only to
  // check permission).
  absl::StatusOr<const ServedModel*> FindModel(const Principal* principal, const std::string& name,
                                               int64_t version = 0,
                                               const CallContext* pin = nullptr) const;

  // The served models the caller of `call` may use (a caller sees only
  // those), in the repository's order: UNAVAILABLE before SetRepository(),
  // then as Authenticate. For listings; admission is Admissible's. The
  // versions are held by the call's leases.
  absl::StatusOr<std::vector<const ServedModel*>> VisibleModels(const CallContext& call) const;

  // Loads (`load`) or unloads the model `name` for the caller of `call`:
  // UNAVAILABLE when not ready or draining; FAILED_PRECONDITION unless the
  // repository is under explicit control (a poll would undo it); then
  // AuthorizeAdmin. The load or unload itself runs on the repository's
  // worker thread, which calls `done` with its outcome; a refusal calls
  // `done` inline. Queued when a drain starts: `done` gets UNAVAILABLE
  // "server is shutting down" then (on the draining thread).
  void ControlModel(const CallContext& call, const std::string& name, bool load,
                    std::function<void(const absl::Status&)> done);
  // OK when the caller of `call` may load and unload `model` (see
  // ServiceOptions::admin_authenticator); UNAUTHENTICATED for an unknown
  // token, PERMISSION_DENIED naming the flag otherwise.
  absl::Status AuthorizeAdmin(const CallContext& call, const std::string& model) const;

  // Reserves `bytes` of the in-flight byte budget, or RESOURCE_EXHAUSTED
  // naming the limit. Every admitted byte is released with Release().
  absl::Status Admit(int64_t bytes);
  void Release(int64_t bytes);
  int64_t inflight_bytes() const { return budget_.used(); }
  InflightBudget& budget() { return budget_; }

  const ServiceOptions& options() const { return options_; }
  // Null until SetRepository().
  const ModelRepository* repository() const { return repository_.load(); }
  bool draining() const { return draining_.load(); }
  const RequestLog& log() const { return log_; }

  // Gives `pending` the deadline and the cancellation of `call`, which the
  // batcher checks while it is queued.
  static void Bind(const CallContext& call, PendingRequest* pending);
  // Bind, then the tenant: the caller's token (its Principal) and weight, for
  // the model's fair queue, after taking the request from the token's rate
  // limits (RESOURCE_EXHAUSTED with a retry hint when over one, counted in
  // attention_tenant_refusals_total{reason="rate"} of `model`). Without
  // tokens every request is the one tenant.
  absl::Status Tag(const CallContext& call, const ServedModel& model, PendingRequest* pending);

 private:
  // RESOURCE_EXHAUSTED, naming the sizes, when the response to `in` (output,
  // weights, framing) would exceed max_response_bytes, or its weights buffer
  // or working memory the batcher's caps; else OK with the estimate in
  // *response_bytes.
  absl::Status CheckResponseSize(const ServedModel& model, const MhaInputs& in, const MhaCall& call,
                                 size_t id_bytes, int64_t* response_bytes) const;
  // The caller's name for the log: the token entry's, or "-".
  std::string CallerName(const CallContext& call) const;

  Metrics* const metrics_;
  const ServiceOptions options_;
  std::atomic<ModelRepository*> repository_{nullptr};
  std::atomic<bool> draining_{false};
  InflightBudget budget_;
  TenantRates rates_;  // The tokens' rate= and token_rate= limits.
  RequestLog log_;
  absl::Mutex mu_;
  int64_t inflight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_REQUESTS_REQUEST_PATH_H_
