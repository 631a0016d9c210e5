// File: server/frontends/rest/rest_frontend.cc
#include "server/frontends/rest/rest_frontend.h"

#include <pthread.h>

#include <charconv>
#include <cstdlib>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/frontends/rest/rest_codec.h"
#include "server/frontends/rest/rest_compression.h"
#include "server/frontends/rest/rest_encode.h"
#include "server/frontends/rest/rest_json.h"
#include "server/frontends/rest/rest_routes.h"

namespace attention::server {
namespace {

// The answer to an inference refused before the protocol saw it, counted
// and logged as the protocol counts a refusal.
HttpResponse CountedRefusal(InferenceProtocol* protocol, const CallContext& call,
                            const absl::Status& status) {
  protocol->requests()->Received();
  protocol->requests()->Answered(nullptr, call, status, absl::Now());
  return ErrorResponse(status);
}

// A refusal of a request's head: its body is not read, and the connection
// is closed after the answer.
HeadDecision Refused(HttpResponse response) {
  HeadDecision decision;
  decision.refuse = std::move(response);
  return decision;
}

// An inference's request and response, and its in-flight admission: held
// by its answer until written (HttpResponse::hold).
struct InferState : AdmissionHolder {
  void Hold(std::shared_ptr<Admission> held) override { admission = std::move(held); }
  RestInferRequest decoded;
  inference::ModelInferResponse response;
  std::shared_ptr<Admission> admission;
};

// An inference's answer: encoded (sized first, so one over the limit, JSON
// being ~3x the binary, is refused unbuilt) and compressed as the client
// accepts, holding its admission until written.
HttpResponse EncodeAnswer(const std::shared_ptr<InferState>& state, int64_t max_body,
                          ContentCoding coding) {
  absl::StatusOr<RestBody> out =
      EncodeRestInferWithin(state->response, state->decoded, static_cast<size_t>(max_body));
  if (!out.ok()) return ErrorResponse(out.status());
  HttpResponse res;
  res.body = std::move(out->bytes);
  if (out->header_length) {
    res.SetHeader("Content-Type", "application/octet-stream");
    res.SetHeader("Inference-Header-Content-Length", absl::StrCat(*out->header_length));
  } else {
    res.SetHeader("Content-Type", "application/json");
  }
  CompressResponse(res, coding);
  res.hold = state;  // Admitted until written.
  return res;
}

// The largest infer body decoded on the I/O thread that read it (~0.5 ms
// of JSON), and the largest answer's tensors encoded there (~0.3 ms as
// JSON); larger ones go to RestFrontend's decoder thread.
constexpr size_t kInlineDecodeBytes = 64 << 10;
constexpr size_t kInlineEncodeBytes = 64 << 10;

// The largest body of a repository request (index, load, unload): a few
// parameters at most.
constexpr uint64_t kRepositoryBodyBytes = 64 << 10;

}  // namespace

RestFrontend::RestFrontend(InferenceProtocol* protocol, const RestOptions& options)
    : protocol_(protocol),
      options_(options),
      receive_budget_(options.receive_budget_bytes > 0
                          ? std::make_unique<InflightBudget>(options.receive_budget_bytes, nullptr)
                          : nullptr),
      body_budget_(receive_budget_.get()),
      decoder_(std::make_unique<boost::asio::thread_pool>(1)) {}

absl::StatusOr<std::unique_ptr<RestFrontend>> RestFrontend::Start(InferenceProtocol* protocol,
                                                                  const RestOptions& options) {
  auto f = std::unique_ptr<RestFrontend>(new RestFrontend(protocol, options));
  ASSIGN_OR_RETURN(f->tls_, RestTls::Load({.cert = options.tls_cert_file,
                                           .key = options.tls_key_file,
                                           .client_ca = options.tls_client_ca_file,
                                           .identity = options.tls_identity_file}));
  HttpServerOptions http;
  http.host = options.host;
  http.port = options.port;
  http.io_threads = options.io_threads;
  http.max_connections = options.max_connections;
  http.max_body_bytes = options.max_body_bytes;
  http.idle_timeout = options.keep_alive;
  boost::asio::post(*f->decoder_, [] { pthread_setname_np(pthread_self(), "rest-decode"); });
  ASSIGN_OR_RETURN(f->server_,
                   HttpServer::Start(http, f.get(), f->tls_ ? f->tls_->context() : nullptr));
  return f;
}

RestFrontend::~RestFrontend() { Stop(); }

void RestFrontend::Stop(absl::Duration grace) {
  if (server_ != nullptr) server_->Stop(grace);  // Waits for what decoder_ holds to be answered.
  decoder_->join();
}

HeadDecision RestFrontend::OnHead(const HttpRequest& head) {
  const std::string& method = head.method;
  const bool get = method == "GET" || method == "HEAD";
  if (method != "POST" && !get) {
    HttpResponse res = ErrorResponse(absl::InvalidArgumentError(
        absl::StrCat("method ", method.substr(0, 16), ": expected GET or POST")));
    res.status = 405;
    res.SetHeader("Allow", "GET, HEAD, POST");
    return Refused(std::move(res));
  }
  if (get) {
    if (!head.HasBody()) return {};
    return Refused(
        ErrorResponse(absl::InvalidArgumentError(absl::StrCat(method, ": a body is not read"))));
  }
  if (const absl::StatusOr<ContentCoding> coding = BodyCoding(head); !coding.ok()) {
    return Refused(UnsupportedCoding(coding.status()));
  }
  if (const auto type = head.Header("Content-Type");
      type && absl::StartsWithIgnoreCase(*type, "multipart/form-data")) {
    HttpResponse res = ErrorResponse(absl::InvalidArgumentError(
        "Content-Type: multipart/form-data is not read here; send the request "
        "as application/json or application/octet-stream"));
    res.status = 415;
    return Refused(std::move(res));
  }
  const std::optional<ModelPath> model = ParseModelPath(head.path);
  const bool infer = model.has_value() && model->action == "infer";
  if (!infer && head.path != "/v2/repository/index" && !ControlPath(head.path)) {
    if (IsGetEndpoint(head.path)) return Refused(WrongMethod(head, "GET, HEAD"));
    return Refused(ErrorResponse(
        absl::NotFoundError(absl::StrCat("no endpoint POST ", head.path.substr(0, 200)))));
  }
  // The token before a byte of the body is read.
  const CallRef call = CallOfRequest(head, infer ? Method::kRestModelInfer : Method::kModelInfer);
  absl::Status refused = protocol_->requests()->Authenticate(*call).status();
  if (refused.ok() && infer) refused = RequestDeadline(head).status();
  if (!refused.ok()) {
    if (!infer) return Refused(ErrorResponse(refused));
    call->leases->Asked(model->name);
    return Refused(CountedRefusal(protocol_, *call, refused));
  }
  if (!infer && head.HasBody()) {
    // The repository's bodies are a few parameters: bounded here, and a
    // load's or unload's read only after the caller's admin right (with no
    // body, ControlModel checks it in its order).
    if (const auto control = ControlPath(head.path)) {
      if (absl::Status admin = protocol_->requests()->AuthorizeAdmin(*call, control->first);
          !admin.ok()) {
        return Refused(ErrorResponse(admin));
      }
    }
    auto too_large = [] {
      HttpResponse res = ErrorResponse(absl::InvalidArgumentError(
          absl::StrCat("request body: larger than ", kRepositoryBodyBytes,
                       " bytes (a repository request is {} or a few parameters)")));
      res.status = 413;
      return res;
    };
    if (const auto length = head.Header("Content-Length");
        length && std::strtoull(std::string(*length).c_str(), nullptr, 10) > kRepositoryBodyBytes) {
      return Refused(too_large());
    }
    HeadDecision decision = body_budget_.Admit(head);
    if (decision.refuse.has_value()) return decision;
    auto grow = std::move(decision.on_body_bytes);
    decision.on_body_bytes = [grow, too_large](uint64_t bytes) -> std::optional<HttpResponse> {
      if (bytes > kRepositoryBodyBytes) return too_large();  // Chunked.
      return grow ? grow(bytes) : std::nullopt;
    };
    return decision;
  }
  return body_budget_.Admit(head);
}

void RestFrontend::Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) {
  if (request.method != "POST") {
    HttpResponse res = Get(request);
    if (res.status == 200) CompressResponse(res, PreferredCoding(request));  // A few KiB at most.
    return exchange->Reply(std::move(res));
  }
  if (!ParseModelPath(request.path).has_value()) {  // Repository requests: a few parameters.
    if (absl::Status inflated = Inflate(request, kRepositoryBodyBytes,
                                        "a repository request is {} or a few parameters");
        !inflated.ok()) {
      return exchange->Reply(InflateRefusal(inflated));
    }
  }
  if (request.path == "/v2/repository/index") return exchange->Reply(Index(request));
  if (const auto control = ControlPath(request.path)) {
    return Control(request, control->first, control->second, std::move(exchange));
  }
  const ModelPath path = *ParseModelPath(request.path);  // OnHead let only these through.
  Infer(std::move(request), path, std::move(exchange));
}

absl::Status RestFrontend::Inflate(HttpRequest& req, uint64_t limit,
                                   absl::string_view limit_flag) const {
  ASSIGN_OR_RETURN(const ContentCoding coding, BodyCoding(req));
  if (coding == ContentCoding::kIdentity) return absl::OkStatus();
  const RestBodyBudget* budget = &body_budget_;
  ASSIGN_OR_RETURN(InflatedBody inflated,
                   InflateBody(req.body, coding, limit, limit_flag, [budget, &req](uint64_t bytes) {
                     return budget->ChargeDecoded(req, bytes);
                   }));
  // The compressed body and its charge go; the decoded one and its own stay.
  req.body = std::move(inflated.bytes);
  req.charge = std::move(inflated.charge);
  return absl::OkStatus();
}

void RestFrontend::Control(const HttpRequest& req, const std::string& model, bool load,
                           std::shared_ptr<HttpExchange> exchange) {
  const absl::StatusOr<int> parameters = RepositoryControlParameters(req.body);
  if (!parameters.ok()) return exchange->Reply(ErrorResponse(parameters.status()));
  const CallRef call = CallOfRequest(req, Method::kModelInfer);
  protocol_->RepositoryControl(*call, "", model, *parameters, load,
                               [call, exchange](const absl::Status& outcome) {
                                 if (!outcome.ok()) return exchange->Reply(ErrorResponse(outcome));
                                 HttpResponse res;
                                 ReplyJson(res, "{}");
                                 exchange->Reply(std::move(res));
                               });
}

void RestFrontend::Infer(HttpRequest req, const ModelPath& path,
                         std::shared_ptr<HttpExchange> exchange) {
  if (req.body.size() <= kInlineDecodeBytes && !req.Header("Content-Encoding").has_value()) {
    return DecodeAndSubmit(std::move(req), path, std::move(exchange));
  }
  boost::asio::post(
      *decoder_, [this, req = std::move(req), path, exchange = std::move(exchange)]() mutable {
        if (exchange->cancelled()) {  // Gone while waiting here: not decoded, counted as gRPC's.
          const CallRef call = CallOfRequest(req, Method::kRestModelInfer);
          call->leases->Asked(path.name);
          return exchange->Reply(
              CountedRefusal(protocol_, *call, absl::CancelledError("the client went")));
        }
        DecodeAndSubmit(std::move(req), path, std::move(exchange));
      });
}

void RestFrontend::DecodeAndSubmit(HttpRequest req, const ModelPath& path,
                                   std::shared_ptr<HttpExchange> exchange) {
  InferenceProtocol* p = protocol_;
  auto call = std::make_shared<CallContext>(*CallOfRequest(req, Method::kRestModelInfer));
  call->leases->Asked(path.name);  // For the log line of a request refused before its lookup.
  // The client's deadline (grpc-timeout; OnHead refused a malformed one), as
  // gRPC's: a request still queued when it passes is answered
  // DEADLINE_EXCEEDED, uncomputed.
  if (const auto deadline = RequestDeadline(req); deadline.ok() && deadline->has_value()) {
    call->deadline = **deadline;
  }
  // A client that goes while its request waits cancels it (the batcher drops it).
  call->is_cancelled = [weak = std::weak_ptr<HttpExchange>(exchange)] {
    const auto e = weak.lock();
    return e != nullptr && e->cancelled();
  };
  // A compressed body inflated here, on this I/O thread, as its JSON is
  // read below: bounded by the message limit and charged before it grows.
  if (absl::Status inflated = Inflate(req, options_.max_body_bytes, "--max_message_bytes");
      !inflated.ok()) {
    CountedRefusal(p, *call, inflated);
    return exchange->Reply(InflateRefusal(inflated));
  }
  std::optional<size_t> header_length;
  if (const auto v = req.Header("Inference-Header-Content-Length")) {
    size_t n = 0;
    const auto [end, error] = std::from_chars(v->data(), v->data() + v->size(), n);
    if (error != std::errc() || end != v->data() + v->size()) {
      return exchange->Reply(ErrorResponse(absl::InvalidArgumentError(
          absl::StrCat("Inference-Header-Content-Length: expected a byte count, got '",
                       v->substr(0, 32), "'"))));
    }
    header_length = n;
  }
  absl::StatusOr<RestInferRequest> decoded =
      DecodeRestInfer(req.body, header_length, path.name, path.version);
  std::string().swap(req.body);
  req.charge.reset();  // What was parsed is now the request, which the in-flight budget admits.
  if (!decoded.ok()) return exchange->Reply(CountedRefusal(p, *call, decoded.status()));
  auto state = std::make_shared<InferState>();
  state->decoded = *std::move(decoded);
  const int64_t max_body = options_.max_body_bytes;
  const ContentCoding coding = PreferredCoding(req);
  p->Infer(call, state->decoded.request, &state->response, state.get(),
           [this, state, exchange, max_body, coding](const absl::Status& status) {
             if (!status.ok()) return exchange->Reply(ErrorResponse(status));
             if (exchange->cancelled()) return;  // Nobody to read it.
             // Not on the batcher's thread, which would hold the next batch:
             // a small answer is encoded on the connection's I/O thread, a
             // large one on the decoder's (not to stall an I/O thread).
             auto encode = [state, max_body, coding] {
               return EncodeAnswer(state, max_body, coding);
             };
             size_t tensor_bytes = 0;
             for (const std::string& raw : state->response.raw_output_contents()) {
               tensor_bytes += raw.size();
             }
             if (tensor_bytes <= kInlineEncodeBytes) return exchange->ReplyWith(std::move(encode));
             boost::asio::post(
                 *decoder_, [exchange, encode = std::move(encode)] { exchange->Reply(encode()); });
           });
}

}  // namespace attention::server
