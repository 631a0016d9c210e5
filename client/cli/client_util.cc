#include "client/cli/client_util.h"

#include <grpcpp/support/client_interceptor.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/target_check.h"
#include "proto/codec/status_codes.h"

namespace attention::client {
namespace {

// Adds `authorization: Bearer <token>` to every call's initial metadata.
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* const header_;
};

class BearerTokenFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(std::string token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(&header_);
  }

 private:
  const std::string header_;
};

// Set once by SetChannelSecurity before any channel exists.
struct ResolvedSecurity {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  std::string server_name;
  std::string token;
  bool tls = false;
  bool client_certificate = false;
};
ResolvedSecurity& Security() {
  static ResolvedSecurity* security = new ResolvedSecurity;
  return *security;
}

int& MessageLimit() {
  static int bytes = kMaxMessageBytes;
  return bytes;
}

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<std::string> ReadToken(const std::string& token_file) {
  if (!token_file.empty()) {
    auto token = ReadFile("--token_file", token_file);
    if (!token.ok()) return token.status();
    return std::string(absl::StripAsciiWhitespace(*token));
  }
  const char* env = std::getenv("ATTENTION_TOKEN");
  return env == nullptr ? std::string() : std::string(absl::StripAsciiWhitespace(env));
}

absl::Status SetChannelSecurity(const ChannelSecurity& s) {
  ResolvedSecurity resolved;
  resolved.token = s.token;
  resolved.server_name = s.server_name;
  if (s.cert_file.empty() != s.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert_file and --tls_key_file: a client certificate needs its key, and the reverse");
  }
  if (s.tls || !s.ca_file.empty() || !s.cert_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    if (!s.ca_file.empty()) {
      auto ca = ReadFile("--tls_ca_file", s.ca_file);
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
    }
    if (!s.cert_file.empty()) {
      auto cert = ReadFile("--tls_cert_file", s.cert_file);
      if (!cert.ok()) return cert.status();
      auto key = ReadFile("--tls_key_file", s.key_file);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    resolved.credentials = grpc::SslCredentials(ssl);
    resolved.tls = true;
    resolved.client_certificate = !s.cert_file.empty();
  }
  Security() = std::move(resolved);
  return absl::OkStatus();
}

void SetMaxMessageBytes(int bytes) { MessageLimit() = bytes; }

int MaxMessageBytes() { return MessageLimit(); }

std::string ServiceConfig(const std::string& lb_policy, bool health_check) {
  // Requests refused with UNAVAILABLE (a replica draining or gone) are retried:
  // computing attention has no side effects. With round_robin a retry goes to
  // the next replica, and client-side health checking skips replicas that
  // report NOT_SERVING (draining ones); pick_first retries the same replica.
  // Of the session calls only those without effect on a session's contents
  // are retried; an Append is not (see ReplayingSession for recovery).
  std::string config = R"({"methodConfig": [{"name": [{"service": "attention.v1.AttentionService"},
      {"service": "attention.v1.SessionService", "method": "CreateSession"},
      {"service": "attention.v1.SessionService", "method": "GetSession"},
      {"service": "attention.v1.SessionService", "method": "CloseSession"}],
      "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.02s", "maxBackoff": "0.5s",
                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}])";
  if (!lb_policy.empty()) {
    absl::StrAppend(&config, R"(, "loadBalancingConfig": [{")", lb_policy, R"(": {}}])");
  }
  if (lb_policy == "round_robin" && health_check) {
    absl::StrAppend(&config, R"(, "healthCheckConfig": {"serviceName": ""})");
  }
  return config + "}";
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const std::string& lb_policy) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(MaxMessageBytes());
  args.SetMaxSendMessageSize(MaxMessageBytes());
  // gRPC keeps at most this much of a call for retries (256 KiB by default):
  // a larger request would be committed at once and never retried.
  args.SetInt(GRPC_ARG_PER_RPC_RETRY_BUFFER_SIZE, MaxMessageBytes());
  // When a server ends a connection (its max connection age, a drain), the
  // channel re-resolves the name to find replicas added meanwhile: allow that
  // every 2 s rather than gRPC's default 30 s.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 2000);
  const ResolvedSecurity& security = Security();
  // gRPC's health-check calls do not pass through interceptors, so they
  // cannot carry the token: against a server with --auth_probes every Watch
  // was refused and the channel failed every call UNAVAILABLE. With a token,
  // a draining replica is skipped by retrying its UNAVAILABLE instead.
  args.SetServiceConfigJSON(
      ServiceConfig(lb_policy, security.token.empty() && !TargetCheck::NamesOneServer(target)));
  if (!security.server_name.empty()) args.SetSslTargetNameOverride(security.server_name);
  if (security.token.empty()) {
    return grpc::CreateCustomChannel(target, security.credentials, args);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerTokenFactory>(security.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, security.credentials, args,
                                                                 std::move(interceptors));
}

void SetDeadline(grpc::ClientContext* context, int64_t deadline_ms) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
}

Tensor RandomNormal(const Shape& shape, std::mt19937& rng) {
  Tensor t(DType::kFloat32, shape);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_as<float>()[i] = normal(rng);
  return t;
}

std::string Summarize(const Tensor& t) {
  const int64_t n = t.num_elements();
  if (n == 0) return "empty";
  double sum = 0, sq = 0, lo = INFINITY, hi = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    const double v = LoadAsFloat(t.dtype(), t.data(), i);
    sum += v;
    sq += v * v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const double mean = sum / n;
  std::string first;
  for (int64_t i = 0; i < std::min<int64_t>(n, 4); ++i) {
    absl::StrAppend(&first, i ? ", " : "",
                    absl::StrFormat("%.5g", LoadAsFloat(t.dtype(), t.data(), i)));
  }
  return absl::StrFormat("mean %.5g std %.5g min %.5g max %.5g first [%s%s]", mean,
                         std::sqrt(std::max(0.0, sq / n - mean * mean)), lo, hi, first,
                         n > 4 ? ", ..." : "");
}

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(q * (sorted.size() - 1) + 0.5));
  return sorted[i];
}

std::string CodeName(grpc::StatusCode code) {
  return std::string(wire::StatusCodeName(static_cast<absl::StatusCode>(code)));
}

CallAdvice::Call CallOf(const std::string& target, int64_t deadline_ms) {
  const ResolvedSecurity& security = Security();
  CallAdvice::Call call;
  call.target = target;
  call.tls = security.tls;
  call.client_certificate = security.client_certificate;
  call.token = !security.token.empty();
  call.max_message_bytes = MaxMessageBytes();
  call.deadline_ms = deadline_ms;
  return call;
}

std::string DescribeFailure(const std::string& method, const grpc::Status& status,
                            const std::string& target, int64_t deadline_ms) {
  return CallAdvice::Describe(method, status.error_code(), status.error_message(),
                              CallOf(target, deadline_ms));
}

absl::StatusOr<v1::ModelInfo> FetchModel(v1::AttentionService::Stub* stub, const std::string& name,
                                         int64_t deadline_ms, const std::string& target,
                                         const std::string& command) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline_ms);
  v1::GetModelRequest request;
  request.set_name(name);
  v1::ModelInfo info;
  const grpc::Status status = stub->GetModel(&ctx, request, &info);
  if (!status.ok()) {
    return absl::Status(
        static_cast<absl::StatusCode>(status.error_code()),
        CallAdvice::DescribeAs(absl::StrCat(command, ": cannot read ",
                                            name.empty() ? std::string("the server's default model")
                                                         : absl::StrCat("model '", name, "'")),
                               status.error_code(), status.error_message(),
                               CallOf(target, deadline_ms)));
  }
  return info;
}

}  // namespace attention::client
