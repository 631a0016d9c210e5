#include "server/frontends/rest/rest_frontend.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/status_macros.h"
#include "server/frontends/rest/rest_body_reader.h"
#include "server/frontends/rest/rest_codec.h"
#include "server/frontends/rest/rest_connection_pool.h"
#include "server/frontends/rest/rest_encode.h"
#include "server/frontends/rest/rest_http.h"
#include "server/frontends/rest/rest_json.h"

namespace attention::server {
namespace {

// {m}[/versions/{v}] in a path.
constexpr char kModel[] = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";

CallRef CallOfRequest(const httplib::Request& req, Method method) {
  auto call = std::make_shared<CallContext>();
  call->method = method;
  if (req.has_header("Authorization")) call->authorization = req.get_header_value("Authorization");
  call->peer = absl::StrCat("http:", req.remote_addr, ":", req.remote_port);
  return call;
}

// Holds a request's in-flight admission until the handler returns (the
// response written into the httplib::Response).
class HeldAdmission : public AdmissionHolder {
 public:
  void Hold(std::shared_ptr<Admission> held) override { held_ = std::move(held); }

 private:
  std::shared_ptr<Admission> held_;
};

}  // namespace

RestFrontend::RestFrontend(InferenceProtocol* protocol, const RestOptions& options)
    : protocol_(protocol),
      options_(options),
      receive_budget_(options.receive_budget_bytes > 0
                          ? std::make_unique<InflightBudget>(options.receive_budget_bytes, nullptr)
                          : nullptr),
      body_reader_(
          std::make_unique<RestBodyReader>(options.max_body_bytes, receive_budget_.get())) {}

absl::StatusOr<std::unique_ptr<RestFrontend>> RestFrontend::Start(InferenceProtocol* protocol,
                                                                  const RestOptions& options) {
  auto f = std::unique_ptr<RestFrontend>(new RestFrontend(protocol, options));
  const bool reloading = !options.tls_identity_file.empty();
  const std::string& cert = reloading ? options.tls_identity_file : options.tls_cert_file;
  const std::string& key = reloading ? options.tls_identity_file : options.tls_key_file;
  const bool tls = !cert.empty() && !key.empty();
  if (tls) {
    auto ssl = std::make_unique<httplib::SSLServer>(
        cert.c_str(), key.c_str(),
        options.tls_client_ca_file.empty() ? nullptr : options.tls_client_ca_file.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--http_port: cannot load the TLS certificate '", cert, "', key '", key, "'",
                       options.tls_client_ca_file.empty()
                           ? std::string()
                           : absl::StrCat(" or client CA '", options.tls_client_ca_file, "'")));
    }
    if (reloading) {
      ASSIGN_OR_RETURN(f->identity_, RestTlsIdentity::Load(options.tls_identity_file));
      f->identity_->Install(ssl->ssl_context());
    }
    f->server_ = std::move(ssl);
  } else {
    f->server_ = std::make_unique<httplib::Server>();
  }
  f->tls_ = tls;
  const int threads = std::max(1, options.threads);
  auto load = std::make_shared<RestConnectionPool::Load>();
  f->server_->new_task_queue = [threads, load] { return new RestConnectionPool(threads, load); };
  // Fairness: while connections wait for a thread, a keep-alive connection
  // is closed after its reply (the client reconnects, and queues behind
  // them), so no client waits for as long as others keep sending.
  f->server_->set_post_routing_handler([load](const httplib::Request& req, httplib::Response& res) {
    if (load->waiting.load(std::memory_order_relaxed) > 0 &&
        res.get_header_value("Connection") != "close") {
      CloseAfterReplyTo(req, res);
    }
  });
  f->server_->set_keep_alive_max_count(100000);
  // Headers and body go out as separate writes: without TCP_NODELAY, Nagle
  // and the client's delayed ACK add ~40 ms to every small response.
  f->server_->set_tcp_nodelay(true);
  f->server_->set_keep_alive_timeout(
      std::max<time_t>(1, static_cast<time_t>(absl::ToInt64Seconds(options.keep_alive))));
  // Content-Length bodies past the limit are skipped unread (then 413 below);
  // chunked or compressed ones are cut off by the handlers' readers.
  f->server_->set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  // httplib 0.11 listens with a backlog of 5 and SO_REUSEPORT: connections
  // arriving together (perf_analyzer's 40 at start) overflowed the accept
  // queue, dropped SYNs and reset some. SO_REUSEADDR only (two servers must
  // not share a port), then listen() again with the system's backlog.
  auto listen_fd = std::make_shared<std::atomic<int>>(-1);
  f->server_->set_socket_options([listen_fd](int sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd->store(sock);
  });
  f->Route();
  if (options.port == 0) {
    f->port_ = f->server_->bind_to_any_port(options.host);
  } else if (f->server_->bind_to_port(options.host, options.port)) {
    f->port_ = options.port;
  }
  if (f->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("--http_port: cannot listen on ", options.host, ":", options.port));
  }
  if (listen_fd->load() >= 0) ::listen(listen_fd->load(), SOMAXCONN);
  httplib::Server* server = f->server_.get();
  f->listener_ = std::thread([server] { server->listen_after_bind(); });
  // stop() only stops a server that runs: wait until it does.
  while (!server->is_running()) absl::SleepFor(absl::Milliseconds(1));
  return f;
}

RestFrontend::~RestFrontend() { Stop(); }

void RestFrontend::Stop() {
  if (!listener_.joinable()) return;
  body_reader_->Stop();  // Bodies still being read (a client trickling one) are cut off.
  server_->stop();
  listener_.join();  // listen_after_bind() returns once its pool has finished.
}

void RestFrontend::Route() {
  httplib::Server& s = *server_;
  InferenceProtocol* p = protocol_;
  const int64_t max_body = options_.max_body_bytes;
  // Reads bodies up to the limit, charged to the receive budget.
  const RestBodyReader* read_body = body_reader_.get();

  s.Get("/v2/health/live", [p](const httplib::Request& req, httplib::Response& res) {
    ReplyProbe(res, p->AuthenticateProbe(*CallOfRequest(req, Method::kModelInfer)), true);
  });
  s.Get("/v2/health/ready", [p](const httplib::Request& req, httplib::Response& res) {
    ReplyProbe(res, p->AuthenticateProbe(*CallOfRequest(req, Method::kModelInfer)),
               p->ServerReady());
  });
  s.Get("/v2", [p](const httplib::Request& req, httplib::Response& res) {
    const absl::Status allowed = p->AuthenticateProbe(*CallOfRequest(req, Method::kModelInfer));
    if (!allowed.ok()) return ReplyError(res, allowed);
    inference::ServerMetadataResponse metadata;
    p->ServerMetadata(&metadata);
    ReplyJson(res, ProtoToJson(metadata).dump());
  });
  // Statistics: every model's first, else "stats" would read as a model.
  auto stats = [p](const httplib::Request& req, httplib::Response& res) {
    inference::ModelStatisticsRequest request;
    request.set_name(Group(req, 1));
    request.set_version(Group(req, 2));
    inference::ModelStatisticsResponse response;
    const absl::Status status =
        p->ModelStatistics(*CallOfRequest(req, Method::kModelInfer), request, &response);
    if (!status.ok()) return ReplyError(res, status);
    ReplyJson(res, ProtoToJson(response).dump());
  };
  s.Get("/v2/models/stats", stats);
  s.Get(absl::StrCat(kModel, "/stats"), stats);
  s.Get(absl::StrCat(kModel, "/ready"), [p](const httplib::Request& req, httplib::Response& res) {
    bool ready = false;
    const absl::Status status = p->ModelReady(*CallOfRequest(req, Method::kModelInfer),
                                              Group(req, 1), Group(req, 2), &ready);
    ReplyProbe(res, status, ready);
  });
  s.Get(absl::StrCat(kModel, "/config"), [p](const httplib::Request& req, httplib::Response& res) {
    inference::ModelConfigRequest request;
    request.set_name(Group(req, 1));
    request.set_version(Group(req, 2));
    inference::ModelConfigResponse response;
    const absl::Status status =
        p->ModelConfig(*CallOfRequest(req, Method::kModelInfer), request, &response);
    if (!status.ok()) return ReplyError(res, status);
    ReplyJson(res, ProtoToJson(response.config()).dump());
  });
  s.Get(kModel, [p](const httplib::Request& req, httplib::Response& res) {
    inference::ModelMetadataRequest request;
    request.set_name(Group(req, 1));
    request.set_version(Group(req, 2));
    inference::ModelMetadataResponse response;
    const absl::Status status =
        p->ModelMetadata(*CallOfRequest(req, Method::kModelInfer), request, &response);
    if (!status.ok()) return ReplyError(res, status);
    ReplyJson(res, ProtoToJson(response).dump());
  });
  s.Post("/v2/repository/index", [p, read_body](const httplib::Request& req, httplib::Response& res,
                                                const httplib::ContentReader& reader) {
    if (const auto caller = p->requests()->Authenticate(*CallOfRequest(req, Method::kModelInfer));
        !caller.ok()) {
      return read_body->Refuse(req, res, reader, caller.status());
    }
    std::string body;
    std::shared_ptr<Admission> charge;
    if (!read_body->Read(req, res, reader, &body, &charge)) return;
    inference::RepositoryIndexRequest request;
    if (!body.empty()) {
      const nlohmann::json json = nlohmann::json::parse(body, nullptr, false);
      if (!json.is_object() || (json.contains("ready") && !json["ready"].is_boolean())) {
        return ReplyError(res, absl::InvalidArgumentError(
                                   "request body: expected {} or {\"ready\": true|false}"));
      }
      request.set_ready(json.value("ready", false));
    }
    inference::RepositoryIndexResponse response;
    const absl::Status status =
        p->RepositoryIndex(*CallOfRequest(req, Method::kModelInfer), request, &response);
    if (!status.ok()) return ReplyError(res, status);
    nlohmann::json models = nlohmann::json::array();
    for (const auto& m : response.models()) models.push_back(ProtoToJson(m));
    ReplyJson(res, models.dump());
  });
  for (const bool load : {true, false}) {
    s.Post(absl::StrCat("/v2/repository/models/([^/]+)/", load ? "load" : "unload"),  // Triton's
           [p, read_body, load](const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader& reader) {
             // The token first, as for the index: a body is charged when read.
             const CallRef call = CallOfRequest(req, Method::kModelInfer);
             if (const auto caller = p->requests()->Authenticate(*call); !caller.ok()) {
               return read_body->Refuse(req, res, reader, caller.status());
             }
             std::string body;
             std::shared_ptr<Admission> charge;
             if (!read_body->Read(req, res, reader, &body, &charge)) return;
             const absl::Status outcome = p->RepositoryControlAndWait(
                 *call, Group(req, 1), RepositoryControlParameters(body), load);
             outcome.ok() ? ReplyJson(res, "{}") : ReplyError(res, outcome);
           });
  }
  s.Post(absl::StrCat(kModel, "/infer"), [p, read_body, max_body](
                                             const httplib::Request& req, httplib::Response& res,
                                             const httplib::ContentReader& reader) {
    const CallRef call = CallOfRequest(req, Method::kRestModelInfer);
    call->leases->Asked(Group(req, 1));  // For the log line of a request refused before its lookup.
    // The token first: parsing a body costs about 4 times its size in memory.
    if (const auto caller = p->requests()->Authenticate(*call); !caller.ok()) {
      read_body->Refuse(req, res, reader, caller.status());
      p->requests()->Received();
      p->requests()->Answered(nullptr, *call, caller.status(), absl::Now());
      return;
    }
    std::string body;
    std::shared_ptr<Admission> charge;
    if (!read_body->Read(req, res, reader, &body, &charge)) return;
    std::optional<size_t> header_length;
    if (req.has_header("Inference-Header-Content-Length")) {
      const std::string v = req.get_header_value("Inference-Header-Content-Length");
      size_t n = 0;
      const auto [end, error] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (error != std::errc() || end != v.data() + v.size()) {
        return ReplyError(res, absl::InvalidArgumentError(absl::StrCat(
                                   "Inference-Header-Content-Length: expected a byte count, got '",
                                   v.substr(0, 32), "'")));
      }
      header_length = n;
    }
    absl::StatusOr<RestInferRequest> decoded =
        DecodeRestInfer(body, header_length, Group(req, 1), Group(req, 2));
    std::string().swap(body);
    charge.reset();  // What was parsed is now the request, which the in-flight budget admits.
    if (!decoded.ok()) {
      // Counted and logged as the protocol counts a refusal.
      p->requests()->Received();
      p->requests()->Answered(nullptr, *call, decoded.status(), absl::Now());
      return ReplyError(res, decoded.status());
    }
    inference::ModelInferResponse response;
    HeldAdmission held;
    absl::Notification answered;
    absl::Status result;
    p->Infer(call, decoded->request, &response, &held, [&](const absl::Status& status) {
      result = status;
      answered.Notify();
    });
    answered.WaitForNotification();
    if (!result.ok()) return ReplyError(res, result);
    RestBody out = EncodeRestInfer(response, *decoded);
    if (out.bytes.size() > static_cast<size_t>(max_body)) {  // JSON numbers: ~3x the binary.
      return ReplyError(
          res, absl::ResourceExhaustedError(absl::StrCat(
                   "response: ", out.bytes.size(), " bytes", out.header_length ? "" : " as JSON",
                   ", larger than the server's limit of ", max_body,
                   " bytes (--max_message_bytes); ask for binary outputs "
                   "(parameters.binary_data_output)")));
    }
    res.status = 200;
    res.body = std::move(out.bytes);
    if (out.header_length) {
      res.set_header("Content-Type", "application/octet-stream");
      res.set_header("Inference-Header-Content-Length", absl::StrCat(*out.header_length));
    } else {
      res.set_header("Content-Type", "application/json");
    }
  });
  // Any other POST: its body read and dropped, then refused.
  s.Post(".*", [read_body](const httplib::Request& req, httplib::Response& res,
                           const httplib::ContentReader& reader) {
    read_body->Refuse(
        req, res, reader,
        absl::NotFoundError(absl::StrCat("no endpoint POST ", req.path.substr(0, 200))));
  });
  // Before httplib reads a body for a method with no handler (whole, into
  // memory, without limit) or leaves a GET's unread: refused, and the
  // connection closed. As is a Transfer-Encoding httplib cannot frame.
  s.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    const std::string te = req.get_header_value("Transfer-Encoding");
    const bool get = req.method == "GET" || req.method == "HEAD";
    if (!te.empty() && !absl::EqualsIgnoreCase(te, "chunked")) {
      ReplyError(res, absl::UnimplementedError(absl::StrCat(
                          "Transfer-Encoding: expected chunked, got '", te.substr(0, 64), "'")));
    } else if (!te.empty() && req.has_header("Content-Length")) {
      // RFC 9112 6.1: a proxy may have framed it by its Content-Length; the
      // connection must be closed after the reply.
      ReplyError(res, absl::InvalidArgumentError(absl::StrCat(
                          "Content-Length: expected none with Transfer-Encoding: chunked, got '",
                          req.get_header_value("Content-Length").substr(0, 32), "'")));
    } else if (req.method != "POST" && !get) {
      ReplyError(res, absl::InvalidArgumentError(absl::StrCat("method ", req.method.substr(0, 16),
                                                              ": expected GET or POST")));
      res.status = 405;
      res.set_header("Allow", "GET, HEAD, POST");
    } else if (get && HasBody(req)) {
      ReplyError(res, absl::InvalidArgumentError(absl::StrCat(req.method, ": a body is not read")));
    } else {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    CloseAfterReplyTo(req, res);
    return httplib::Server::HandlerResponse::Handled;
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.content_provider_) return;
    const absl::Status status = res.status == 404
                                    ? absl::NotFoundError(absl::StrCat(
                                          "no endpoint ", req.method, " ", req.path.substr(0, 200)))
                                    : absl::InvalidArgumentError(absl::StrCat("HTTP ", res.status));
    const int code = res.status;
    ReplyError(res, status);
    res.status = code;
  });
}

}  // namespace attention::server
