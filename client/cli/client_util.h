// File: client/cli/client_util.h
//
// Small pieces the attention-client subcommands share: channels (any gRPC
// target, optional load-balancing policy), deadlines, random inputs, and a
// one-line summary of a tensor.
#ifndef ATTENTION_CLIENT_CLI_CLIENT_UTIL_H_
#define ATTENTION_CLIENT_CLI_CLIENT_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attention/v1/attention.grpc.pb.h"
#include "client/cli/call_advice.h"
#include "core/tensor.h"

namespace attention::client {

// The largest message a client channel sends or receives, and keeps for
// retries, unless SetMaxMessageBytes says otherwise.
inline constexpr int kMaxMessageBytes = 256 << 20;

// Sets the message limit of every channel MakeChannel makes from now on (call
// once, before any channel; --max_message_bytes); MaxMessageBytes() reads it.
void SetMaxMessageBytes(int bytes);
int MaxMessageBytes();

// The channel's service config: retries of UNAVAILABLE on Infer and
// InferStream, and `lb_policy` if not empty. With `health_check`,
// round_robin (the clients' default) also gets client-side health checking:
// replicas reporting NOT_SERVING get no new calls, and a retry goes to
// another replica. MakeChannel asks for it only without a token (gRPC's
// health-check calls cannot carry one, and a server with --auth_probes
// refuses them) and for a target that may name several servers
// (TargetCheck::NamesOneServer): with one there is no other replica to
// choose, and under a flood past the server's gRPC receive quota
// gRPC may cancel the health Watch call with the others, which makes the
// channel fail every call UNAVAILABLE for the Watch's retry backoff (1 s,
// then 1.6 times longer for each failure in a row, up to 120 s). Named
// targets stay exposed to that.
std::string ServiceConfig(const std::string& lb_policy, bool health_check = true);

// How channels reach the server: plaintext (the default) or TLS, optionally
// with a client certificate (mutual TLS), and a bearer token sent on every
// call as `authorization: Bearer <token>`.
struct ChannelSecurity {
  bool tls = false;         // TLS; implied by any of the files below.
  std::string ca_file;      // PEM roots to trust; empty: the system's.
  std::string cert_file;    // Client certificate chain (mutual TLS).
  std::string key_file;     // Its private key.
  std::string server_name;  // Expected name in the server's certificate; empty: the target's host.
  std::string token;        // Bearer token; empty: none.
};

// Reads the files of `security` and uses it for every channel MakeChannel
// makes from now on (call once, before any channel). NOT_FOUND for an
// unreadable file, INVALID_ARGUMENT for a certificate without its key.
absl::Status SetChannelSecurity(const ChannelSecurity& security);

// The token of `token_file` (whitespace trimmed) if set, else of the
// environment variable ATTENTION_TOKEN, else empty.
absl::StatusOr<std::string> ReadToken(const std::string& token_file);

// A channel to `target` ("host:port", "dns:///host:port",
// "ipv4:127.0.0.1:1,127.0.0.1:2", ...) with the security set by
// SetChannelSecurity. `lb_policy` ("round_robin", "pick_first" or empty for
// gRPC's default, pick_first) goes into the service config. Requests up to
// MaxMessageBytes() are retried.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const std::string& lb_policy);

// Sets a deadline `deadline_ms` from now (every call has one).
void SetDeadline(grpc::ClientContext* context, int64_t deadline_ms);

// Normal(0, 1) float32 values from `rng`.
Tensor RandomNormal(const Shape& shape, std::mt19937& rng);

// "mean 0.01 std 0.98 min -3.2 max 3.1 first [0.12, -0.4, ...]".
std::string Summarize(const Tensor& t);

// The q-quantile (0..1) of ascending `sorted` (nearest rank); 0 if empty.
double Percentile(const std::vector<double>& sorted, double q);

// "OK", "INVALID_ARGUMENT", ... for a gRPC status code.
std::string CodeName(grpc::StatusCode code);

// How a call to `target` with `deadline_ms` is made, for CallAdvice: the
// security set by SetChannelSecurity and the limit of SetMaxMessageBytes.
CallAdvice::Call CallOf(const std::string& target, int64_t deadline_ms);

// The report of a failed call of `method` to `target`: CallAdvice::Describe
// with CallOf(target, deadline_ms).
std::string DescribeFailure(const std::string& method, const grpc::Status& status,
                            const std::string& target, int64_t deadline_ms);

// The model description (GetModel; empty name: the default model) that
// `command` ("infer", "load", ...) needs. On failure, the status keeps the
// call's code and its message names what the user asked for ("infer: cannot
// read model 'demo': UNAVAILABLE: ...", with a hint).
absl::StatusOr<v1::ModelInfo> FetchModel(v1::AttentionService::Stub* stub, const std::string& name,
                                         int64_t deadline_ms, const std::string& target,
                                         const std::string& command);

}  // namespace attention::client

#endif  // ATTENTION_CLIENT_CLI_CLIENT_UTIL_H_
