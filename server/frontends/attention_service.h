// File: server/frontends/attention_service.h
//
// The attention.v1.AttentionService implementation on gRPC's callback API.
// A handler only decodes, validates (once) and enqueues; the batch's
// completion, on the model's batcher thread, encodes the response and
// finishes the call. No reaction blocks.
//
// Thread-safe. The repository and metrics must outlive the service.
#ifndef ATTENTION_SERVER_FRONTENDS_ATTENTION_SERVICE_H_
#define ATTENTION_SERVER_FRONTENDS_ATTENTION_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attention/v1/attention.grpc.pb.h"
#include "server/batching/model_repository.h"
#include "server/batching/pending_request.h"
#include "server/metrics/metrics.h"
#include "server/requests/inflight_budget.h"
#include "server/security/token_authenticator.h"

namespace attention::server {

class AdmittedUnaryReactor;

struct ServiceOptions {
  // Largest response message; a request whose response would be larger is
  // refused with RESOURCE_EXHAUSTED before it is computed.
  int64_t max_response_bytes = 64 << 20;
  // Per InferStream: requests read but whose responses are not yet written,
  // by count and by bytes (request plus estimated response). At either cap
  // the stream stops reading until the client reads responses, so a client
  // that never reads holds at most this much server memory.
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
};

class AttentionServiceImpl final : public v1::AttentionService::CallbackService {
 public:
  // Requests get UNAVAILABLE ("not ready") until SetRepository(). A request
  // whose response would exceed options.max_response_bytes is refused.
  AttentionServiceImpl(Metrics* metrics, ServiceOptions options);

  // Makes the service ready to serve `repository`'s models.
  void SetRepository(const ModelRepository* repository);
  // From now on every new request gets UNAVAILABLE; accepted ones complete.
  void StartDraining();
  // Waits until no accepted request is unanswered, or `timeout`. True if idle.
  bool WaitIdle(absl::Duration timeout);

  grpc::ServerUnaryReactor* Infer(grpc::CallbackServerContext* context,
                                  const v1::InferRequest* request,
                                  v1::InferResponse* response) override;
  grpc::ServerBidiReactor<v1::InferRequest, v1::InferResponse>* InferStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* context,
                                     const v1::GetModelRequest* request,
                                     v1::ModelInfo* response) override;

  // A decoded, validated request and the model it is for.
  struct Prepared {
    const ServedModel* model = nullptr;  // Set once the model is found.
    std::unique_ptr<PendingRequest> pending;
    int64_t response_bytes = 0;  // Estimated size of the encoded response.
  };

  // Authenticates the caller, then decodes and validates `request` (kept
  // alive by `keep_alive`) into *prepared, ready for its model's batcher once
  // `done` is set. Errors: UNAVAILABLE when not ready or draining,
  // UNAUTHENTICATED or PERMISSION_DENIED (see Authenticate and FindModel),
  // NOT_FOUND for an unknown model, INVALID_ARGUMENT for bad tensors or
  // options, RESOURCE_EXHAUSTED when the response (or the weights buffer
  // computing it) would be too large.
  absl::Status Prepare(const v1::InferRequest& request, std::shared_ptr<const void> keep_alive,
                       grpc::CallbackServerContext* context, Prepared* prepared);

  // The first steps of every protocol's request: UNAVAILABLE when not ready
  // or draining, then Authenticate and FindModel. Sets *caller (if given) to
  // the authenticated principal (null without authentication).
  absl::StatusOr<const ServedModel*> Admissible(grpc::CallbackServerContext* context,
                                                const std::string& model,
                                                std::shared_ptr<const Principal>* caller = nullptr);
  // The last steps: validates `pending->inputs` against prepared->model,
  // sizes the response (RESOURCE_EXHAUSTED when too large), binds the call's
  // deadline and cancellation, and stores the request in *prepared.
  absl::Status Finalize(std::unique_ptr<PendingRequest> pending, size_t id_bytes,
                        std::shared_ptr<const void> keep_alive,
                        grpc::CallbackServerContext* context, Prepared* prepared);
  // Admits a prepared unary request (its `request_bytes` and its response)
  // against the in-flight budget and queues it; `done` gets the outcome. The
  // bytes are held by `reactor` (until the call is done) when given, else
  // released before `done`. OK: queued (`done` will be called); else the
  // error to answer with, and nothing stays admitted.
  absl::Status Submit(Prepared& prepared, int64_t request_bytes,
                      std::function<void(RequestOutcome)> done,
                      AdmittedUnaryReactor* reactor = nullptr);

  // Counts a request as answered: metrics by method and code, duration, and
  // the in-flight gauge. Unary handlers call it just before Finish(), so a
  // client that has its response also sees it counted.
  void Answered(const ServedModel* model, Method method, absl::StatusCode code,
                absl::Time received);
  // Counts a request as received (in flight).
  void Received();

  // The caller of `context`: null when authentication is off (every model
  // allowed), else its principal; UNAUTHENTICATED (counted) when the call
  // carries no known token.
  absl::StatusOr<std::shared_ptr<const Principal>> Authenticate(
      const grpc::CallbackServerContext* context) const;
  // The served model `name` names for `principal` (null: authentication
  // off): PERMISSION_DENIED (counted) when the caller may not use it, which
  // for a caller limited to some models also hides whether it exists;
  // NOT_FOUND when it is not served.
  absl::StatusOr<const ServedModel*> FindModel(const Principal* principal,
                                               const std::string& name) const;

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

 private:
  // RESOURCE_EXHAUSTED, naming the sizes, when the response to `in` (output,
  // weights, framing) would exceed max_response_bytes, or its weights buffer
  // or working memory the batcher's caps; else OK with the estimate in
  // *response_bytes.
  absl::Status CheckResponseSize(const ServedModel& model, const MhaInputs& in, const MhaCall& call,
                                 size_t id_bytes, int64_t* response_bytes) const;

  Metrics* const metrics_;
  const ServiceOptions options_;
  std::atomic<const ModelRepository*> repository_{nullptr};
  std::atomic<bool> draining_{false};
  InflightBudget budget_;
  absl::Mutex mu_;
  int64_t inflight_ ABSL_GUARDED_BY(mu_) = 0;
};

// Gives `pending` the deadline and the cancellation of the call carrying it,
// which the batcher checks while it is queued.
void BindCall(grpc::CallbackServerContext* context, PendingRequest* pending);

// Fills `response` from a computed outcome (output, weights, timing).
// RESOURCE_EXHAUSTED (and `response` cleared) when it would exceed
// `max_bytes` or memory runs out.
absl::Status EncodeOutcome(RequestOutcome& outcome, int64_t max_bytes, v1::InferResponse* response);

// A model's description as the API reports it.
void DescribeModel(const ServedModel& model, bool is_default, v1::ModelInfo* info);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_ATTENTION_SERVICE_H_
