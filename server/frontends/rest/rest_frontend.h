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
//   GET  /v2/models/{m}[/versions/{v}] (metadata), .../ready, .../config,
//        .../stats, and /v2/models/stats (every model)
//   POST /v2/models/{m}[/versions/{v}]/infer, /v2/repository/index
//
// Served by cpp-httplib on a RestConnectionPool: up to `threads` threads,
// started when first needed, each serving one connection at a time
// (keep-alive connections hold theirs until idle for `keep_alive`).
// Connections beyond it wait; while they do, each keep-alive connection is
// closed after its current reply, so waiting ones get served. A handler waits
// for its request's answer while the batcher computes it. Request bodies
// are read up to `max_body_bytes` (after any Content-Encoding is undone),
// chunked or not; beyond it, 413. An inference's token is checked before
// its body is parsed. A POST with neither Content-Length nor
// Transfer-Encoding has no body (RFC 9112); other methods than GET, HEAD and
// POST (405), a GET with a body (400) and a Transfer-Encoding other than
// chunked (501) are refused before any body is read; a body that is not
// read whole closes its connection after the answer, so that its rest is
// never read as a request. A response, JSON or binary, larger than
// `max_body_bytes` is RESOURCE_EXHAUSTED (429): JSON numbers take about
// three times their binary size.
//
// Thread-safe. The protocol (and its request path) must outlive it; Stop()
// (or the destructor) returns once no handler runs.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_FRONTEND_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_FRONTEND_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/frontends/protocol/inference_protocol.h"
#include "server/frontends/rest/rest_body_reader.h"
#include "server/frontends/rest/rest_tls_identity.h"
#include "server/requests/inflight_budget.h"

namespace httplib {
class Server;
}

namespace attention::server {

struct RestOptions {
  std::string host = "0.0.0.0";
  int port = 8000;  // 0: a free port (see port()).
  int threads = 256;
  int64_t max_body_bytes = 64 << 20;  // Request bodies and responses.
  absl::Duration keep_alive = absl::Seconds(5);
  // Bodies being read and parsed, before the in-flight budget admits what
  // was parsed (see RestBodyReader); 0: no limit beyond max_body_bytes.
  int64_t receive_budget_bytes = 0;
  // TLS when both are set (the gRPC port's files); with a client CA, every
  // client must present a certificate it signed.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // Instead of the two above: one file holding the chain and then the key,
  // re-read when it changes (RestTlsIdentity; TlsIdentityWatcher's copy).
  std::string tls_identity_file;
};

class RestFrontend {
 public:
  // Binds and starts serving. UNAVAILABLE when the port cannot be bound,
  // INVALID_ARGUMENT when the TLS files cannot be loaded.
  static absl::StatusOr<std::unique_ptr<RestFrontend>> Start(InferenceProtocol* protocol,
                                                             const RestOptions& options);
  ~RestFrontend();

  RestFrontend(const RestFrontend&) = delete;
  RestFrontend& operator=(const RestFrontend&) = delete;

  // Stops accepting, cuts off bodies still being read, and returns once every
  // handler has returned.
  void Stop();
  int port() const { return port_; }
  bool tls() const { return tls_; }

 private:
  RestFrontend(InferenceProtocol* protocol, const RestOptions& options);
  void Route();

  InferenceProtocol* const protocol_;
  const RestOptions options_;
  std::unique_ptr<InflightBudget> receive_budget_;  // Null: no limit.
  std::unique_ptr<RestBodyReader> body_reader_;
  std::unique_ptr<RestTlsIdentity> identity_;  // Null unless tls_identity_file.
  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
  int port_ = 0;
  bool tls_ = false;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_FRONTEND_H_
