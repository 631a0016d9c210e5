// File: server/frontends/rest/rest_frontend.h
//
// RestFrontend: the KServe v2 REST protocol (HTTP/1.1 + JSON) on its own
// port, with Triton's binary tensor extension and its configuration,
// statistics and repository-index endpoints. Every request is translated to
// InferenceProtocol's operations, so it is authenticated (Authorization:
// Bearer), validated, admitted, batched and counted exactly as the
// inference protocol's gRPC calls are; errors are an HTTP status
// (HttpStatusOf) and {"error": "..."}.
//
//   GET  /v2/health/live, /v2/health/ready, /v2
//   GET  /v2/models (the models, their versions and state)
//   GET  /v2/models/{m}[/versions/{v}] (metadata), .../ready, .../config,
//        .../stats, and /v2/models/stats (every model)
//   POST /v2/models/{m}[/versions/{v}]/infer, /v2/repository/index,
//        /v2/repository/models/{m}/load and .../unload
//
// Served by HttpServer (Boost.Beast): a few I/O threads, every read bounded
// in bytes and time (HttpServerOptions). Each request is judged by its head
// before its body is read (OnHead): other methods than GET, HEAD and POST
// (405), a path asked with the other of GET and POST (405 with Allow,
// naming the method to use), a GET with a body (400), a Content-Encoding other than gzip or
// deflate (415), an unknown POST (404) and a POST whose token fails
// (401/403) are refused unread; a body is then charged to the receive
// budget (RestBodyBudget) by its declared size, and read up to
// `max_body_bytes` (413); a gzip or deflate body is inflated within the
// same limit, its decoded size charged first (rest_compression). Inference
// and repository control run asynchronously: the answer is encoded (and
// compressed, for a client that accepts gzip or deflate) off the batcher's
// thread (a small answer on the connection's I/O thread, a large one on the
// decoder thread, which also decodes large or compressed bodies), and keeps
// the request's in-flight admission until written. A client that goes while its inference waits
// cancels it, and one that sends `grpc-timeout` gives it gRPC's deadline (RequestDeadline): still
// queued when it passes, it is answered DEADLINE_EXCEEDED (504) uncomputed (a malformed one is 400,
// unread). A response larger than `max_body_bytes` is RESOURCE_EXHAUSTED (429): JSON numbers take
// about three times their binary size.
//
// Thread-safe. The protocol (and its request path) must outlive it; Stop()
// (or the destructor) returns once every connection is closed and every
// request answered.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_FRONTEND_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_FRONTEND_H_

#include <memory>
#include <string>

#include <boost/asio/thread_pool.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/frontends/protocol/inference_protocol.h"
#include "server/frontends/rest/http_handler.h"
#include "server/frontends/rest/http_server.h"
#include "server/frontends/rest/rest_body_budget.h"
#include "server/frontends/rest/rest_http.h"
#include "server/frontends/rest/rest_tls.h"
#include "server/requests/inflight_budget.h"

namespace attention::server {

struct RestOptions {
  std::string host = "0.0.0.0";
  int port = 8000;                               // 0: a free port (see port()).
  int io_threads = 2;                            // --http_io_threads.
  int max_connections = 1024;                    // --http_max_connections; one more: 503.
  int64_t max_body_bytes = 64 << 20;             // Request bodies and responses.
  absl::Duration keep_alive = absl::Seconds(5);  // Idle keep-alive connections.
  // Bodies being read and parsed, before the in-flight budget admits what
  // was parsed (see RestBodyBudget); 0: no limit beyond max_body_bytes.
  int64_t receive_budget_bytes = 0;
  // TLS when both are set (the gRPC port's files); with a client CA, every
  // client must present a certificate it signed (the file re-read when it
  // changes: RestClientCa).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // Instead of the two above: one file holding the chain and then the key,
  // re-read when it changes (RestTlsIdentity; TlsIdentityWatcher's copy).
  std::string tls_identity_file;
  // The server's metrics port (--metrics_port; 0: off), named by the answer
  // to GET /metrics here, which is not where metrics are served.
  int metrics_port = 0;
};

class RestFrontend : public HttpHandler {
 public:
  // Binds and starts serving. UNAVAILABLE when the port cannot be bound,
  // INVALID_ARGUMENT when the TLS files cannot be loaded.
  static absl::StatusOr<std::unique_ptr<RestFrontend>> Start(InferenceProtocol* protocol,
                                                             const RestOptions& options);
  ~RestFrontend() override;

  RestFrontend(const RestFrontend&) = delete;
  RestFrontend& operator=(const RestFrontend&) = delete;

  // Stops accepting; connections close after their answer, and after
  // `grace` whatever they do (their requests cancelled). Returns once every
  // request was answered.
  void Stop(absl::Duration grace = absl::ZeroDuration());
  int port() const { return server_ == nullptr ? 0 : server_->port(); }
  bool tls() const { return tls_ != nullptr; }

  HeadDecision OnHead(const HttpRequest& head) override;
  void Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) override;

 private:
  RestFrontend(InferenceProtocol* protocol, const RestOptions& options);
  // GET (and HEAD) routes, answered at once. `/` answers a pointer to the
  // API's paths; `/metrics` a 404 naming the metrics port.
  HttpResponse Get(const HttpRequest& request);
  // Where the metrics are ("... the metrics port, 9464 (--metrics_port)").
  std::string MetricsPointer() const;
  // POST /v2/repository/index: Triton's index, a line per version.
  HttpResponse Index(const HttpRequest& request);
  // GET /v2/models: {"models": [{"name", "state", "reason" (not READY),
  // "versions": [{"version", "state", "reason"}]}]}, the models the caller
  // may use (rest_frontend_get.cc).
  HttpResponse Models(const HttpRequest& request);
  // Decodes a body sent with a Content-Encoding in place (rest_compression),
  // up to `limit` bytes, charged to the receive budget in place of the
  // compressed body's charge. OUT_OF_RANGE past the limit (named by
  // `limit_flag`), INVALID_ARGUMENT for a corrupt body, RESOURCE_EXHAUSTED.
  absl::Status Inflate(HttpRequest& request, uint64_t limit, absl::string_view limit_flag) const;
  // Decodes and submits an inference: inline for a small body, on decoder_
  // for a large or compressed one.
  void Infer(HttpRequest request, const ModelPath& path, std::shared_ptr<HttpExchange> exchange);
  void DecodeAndSubmit(HttpRequest request, const ModelPath& path,
                       std::shared_ptr<HttpExchange> exchange);
  void Control(const HttpRequest& request, const std::string& model, bool load,
               std::shared_ptr<HttpExchange> exchange);

  InferenceProtocol* const protocol_;
  const RestOptions options_;
  std::unique_ptr<InflightBudget> receive_budget_;  // Null: no limit.
  RestBodyBudget body_budget_;
  std::unique_ptr<RestTls> tls_;  // Null: plain HTTP.
  std::unique_ptr<HttpServer> server_;
  // One thread decoding the bodies too large to decode on an I/O thread
  // (over kInlineDecodeBytes, or compressed): a large JSON body takes
  // hundreds of milliseconds, which would stall every connection the I/O
  // thread serves (health probes included). Large bodies wait for each
  // other here, as many as the receive budget admits.
  std::unique_ptr<boost::asio::thread_pool> decoder_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_FRONTEND_H_
