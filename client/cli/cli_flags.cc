// attention-client's flags (cli_flags.h).
#include "client/cli/cli_flags.h"

#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/cli/client_util.h"

ABSL_FLAG(std::string, server, "localhost:50051",
          "gRPC target: host:port, dns:///host:port, ipv4:127.0.0.1:1,127.0.0.1:2, ...");
ABSL_FLAG(int64_t, deadline_ms, 10000, "Deadline of every call, in milliseconds.");
ABSL_FLAG(std::string, lb_policy, "round_robin",
          "Load-balancing policy: round_robin (with client-side health checking, so retries "
          "and new calls skip draining replicas) or pick_first.");
ABSL_FLAG(bool, tls, false, "Use TLS (implied by any --tls_*_file flag).");
ABSL_FLAG(std::string, tls_ca_file, "",
          "PEM CA bundle that signed the server's certificate; empty: the system's roots.");
ABSL_FLAG(std::string, tls_cert_file, "", "PEM client certificate (mutual TLS).");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name the server's certificate must carry; empty: the host of --server.");
ABSL_FLAG(std::string, token_file, "",
          "File holding a bearer token, sent as 'authorization: Bearer <token>'; empty: the "
          "ATTENTION_TOKEN environment variable, if set.");
ABSL_FLAG(int, max_message_bytes, attention::client::kMaxMessageBytes,
          "Largest message this client sends or receives, in bytes (the server has its own "
          "--max_message_bytes, 64 MiB by default).");
ABSL_FLAG(std::string, model, "", "Model name; empty: the server's default model.");
ABSL_FLAG(int64_t, model_version, 0, "infer: the model version to run; 0: the newest serving.");
// infer
ABSL_FLAG(std::string, query, "", "infer: query .npy file (N, L, E) or (L, E).");
ABSL_FLAG(std::string, key, "", "infer: key .npy file; absent: the query.");
ABSL_FLAG(std::string, value, "", "infer: value .npy file; absent: the key.");
ABSL_FLAG(std::string, key_padding_mask, "", "infer: key_padding_mask .npy file (bool or float).");
ABSL_FLAG(std::string, attn_mask, "", "infer: attn_mask .npy file (bool or float).");
ABSL_FLAG(int64_t, batch, 1, "infer/load: random inputs' batch size N.");
ABSL_FLAG(std::string, seq_len, "32", "infer/load: random query length L, or MIN:MAX for load.");
ABSL_FLAG(std::string, kv_seq_len, "0",
          "infer/load: random key/value length S (0: self-attention), or MIN:MAX for load.");
ABSL_FLAG(uint32_t, seed, 1, "infer/load: seed of the random inputs.");
ABSL_FLAG(bool, is_causal, false, "Apply the causal mask.");
ABSL_FLAG(bool, need_weights, false, "Ask for attention weights.");
ABSL_FLAG(bool, per_head_weights, false, "Weights per head instead of averaged.");
ABSL_FLAG(std::string, output_dtype, "", "float32, bfloat16 or float16; empty: the query's.");
ABSL_FLAG(std::string, output, "", "infer: save the output to this .npy file.");
ABSL_FLAG(std::string, weights_output, "", "infer: save the attention weights to this .npy file.");
ABSL_FLAG(std::string, request_id, "cli", "infer: request id.");
// health
ABSL_FLAG(std::string, service, "", "health: service name ('' = the whole server).");
// load
ABSL_FLAG(std::string, concurrency, "1", "load: comma-separated concurrency levels.");
ABSL_FLAG(std::string, duration, "10s", "load: duration per level (e.g. 10s, 500ms).");
ABSL_FLAG(int64_t, requests, 0, "load: requests per level instead of a duration.");
ABSL_FLAG(double, rate, 0,
          "load: requests per second, sent on a fixed schedule by the level's workers (an open "
          "loop: latency counts from each request's due time, so a late send counts its wait); "
          "0: a closed loop, each worker sending its next request once answered.");
ABSL_FLAG(std::string, rpc, "unary", "load: unary or stream.");
ABSL_FLAG(std::string, protocol, "attention",
          "load: attention (attention.v1 Infer/InferStream) or kserve (the Open Inference "
          "Protocol's ModelInfer/ModelStreamInfer).");
ABSL_FLAG(double, pad_share, 0.0, "load: share of each request's keys masked as padding.");
ABSL_FLAG(std::string, csv, "", "load: also write the table as CSV to this file.");
ABSL_FLAG(std::string, json, "", "load: also write the table as JSON to this file.");
// session, load --sessions
ABSL_FLAG(int64_t, tokens, 64, "session: tokens in the generated sequence.");
ABSL_FLAG(int64_t, chunk, 1, "session: tokens per append.");
ABSL_FLAG(int64_t, sessions, 0,
          "load: run a decode load over this many concurrent sessions instead of Infer.");
ABSL_FLAG(int64_t, steps, 32, "load --sessions: one-token steps per session.");
ABSL_FLAG(int64_t, context, 0, "load --sessions: tokens each session prefills first.");

namespace attention::client {

// INVALID_ARGUMENT naming the flag and its value when a numeric flag is out
// of its range.
absl::Status CheckFlagRanges() {
  for (const auto& [name, value, min] : std::vector<std::tuple<const char*, int64_t, int64_t>>{
           {"deadline_ms", absl::GetFlag(FLAGS_deadline_ms), 1},
           {"max_message_bytes", absl::GetFlag(FLAGS_max_message_bytes), 1},
           {"model_version", absl::GetFlag(FLAGS_model_version), 0},
           {"batch", absl::GetFlag(FLAGS_batch), 1},
           {"requests", absl::GetFlag(FLAGS_requests), 0},
           {"tokens", absl::GetFlag(FLAGS_tokens), 1},
           {"chunk", absl::GetFlag(FLAGS_chunk), 1},
           {"sessions", absl::GetFlag(FLAGS_sessions), 0},
           {"steps", absl::GetFlag(FLAGS_steps), 1},
           {"context", absl::GetFlag(FLAGS_context), 0}}) {
    if (value < min) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, "=", value, ": expected a number >= ", min));
    }
  }
  const double rate = absl::GetFlag(FLAGS_rate), pad = absl::GetFlag(FLAGS_pad_share);
  if (!(rate >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rate=", rate, ": expected requests per second >= 0 (0: a closed loop)"));
  }
  if (!(pad >= 0 && pad <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pad_share=", pad, ": expected a share from 0 to 1"));
  }
  return absl::OkStatus();
}

}  // namespace attention::client
