// attention-client: the sample client and load generator of the attention
// service.
//
//   attention-client infer  [--query q.npy ... | --batch 2 --seq_len 16] [options]
//   attention-client models
//   attention-client health [--service NAME]      # exit 0 only when SERVING
//   attention-client load   --concurrency 1,8,64 --duration 10s --seq_len 16:128
//   attention-client load   --sessions 64 --context 512 --steps 32   # decode load
//   attention-client session --tokens 64 [--chunk 4]   # check a session against Infer
//
// Every subcommand takes --server TARGET (any gRPC target, one address or
// several, balanced round_robin by default) and --deadline_ms.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/cli/call_advice.h"
#include "client/cli/client_util.h"
#include "client/cli/load_generator.h"
#include "client/cli/npy.h"
#include "client/cli/session_commands.h"
#include "client/cli/target_check.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "proto/codec/tensor_codec.h"

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
namespace {

int Fail(const std::string& message, int code = 1) {
  std::cerr << "attention-client: " << message << "\n";
  return code;
}

std::unique_ptr<v1::AttentionService::Stub> Stub() {
  return v1::AttentionService::NewStub(
      MakeChannel(absl::GetFlag(FLAGS_server), absl::GetFlag(FLAGS_lb_policy)));
}

// "CODE: message", and what to do about it when the client can tell.
std::string RpcError(int code, const std::string& message) {
  CallAdvice::Call call;
  call.target = absl::GetFlag(FLAGS_server);
  call.tls = absl::GetFlag(FLAGS_tls) || !absl::GetFlag(FLAGS_tls_ca_file).empty() ||
             !absl::GetFlag(FLAGS_tls_cert_file).empty();
  call.client_certificate = !absl::GetFlag(FLAGS_tls_cert_file).empty();
  call.max_message_bytes = MaxMessageBytes();
  const std::string hint = CallAdvice::For(code, message, call);
  return absl::StrCat(CodeName(static_cast<grpc::StatusCode>(code)), ": ", message,
                      hint.empty() ? "" : absl::StrCat("\n  hint: ", hint));
}

std::string RpcError(const grpc::Status& status) {
  return RpcError(status.error_code(), status.error_message());
}

// Loads `flag`'s .npy file into `out` when given.
absl::Status LoadInto(const std::string& path, v1::Tensor* out) {
  if (path.empty()) return absl::OkStatus();
  auto t = ReadNpy(path);
  if (!t.ok()) return t.status();
  wire::EncodeTensor(*t, out);
  return absl::OkStatus();
}

int Infer() {
  auto stub = Stub();
  v1::InferRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  if (!absl::GetFlag(FLAGS_query).empty()) {
    for (auto [path, field] : std::vector<std::pair<std::string, v1::Tensor*>>{
             {absl::GetFlag(FLAGS_query), request.mutable_query()},
             {absl::GetFlag(FLAGS_key), request.mutable_key()},
             {absl::GetFlag(FLAGS_value), request.mutable_value()}}) {
      const absl::Status s = LoadInto(path, field);
      if (!s.ok()) return Fail(std::string(s.message()));
    }
    // A field is absent only when its flag was not given: an empty tensor
    // that was given goes to the server, which judges its shape.
    if (absl::GetFlag(FLAGS_key).empty()) request.clear_key();
    if (absl::GetFlag(FLAGS_value).empty()) request.clear_value();
  } else {
    auto model =
        FetchModel(stub.get(), absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_deadline_ms));
    if (!model.ok()) {
      return Fail(
          absl::StrCat("GetModel failed: ", RpcError(static_cast<int>(model.status().code()),
                                                     std::string(model.status().message()))));
    }
    auto l = ParseRange(absl::GetFlag(FLAGS_seq_len));
    auto s = ParseRange(absl::GetFlag(FLAGS_kv_seq_len));
    if (!l.ok() || !s.ok()) return Fail("--seq_len/--kv_seq_len: expected a number", 2);
    std::mt19937 rng(absl::GetFlag(FLAGS_seed));
    const int64_t n = absl::GetFlag(FLAGS_batch);
    wire::EncodeTensor(RandomNormal({n, l->min, model->embed_dim()}, rng), request.mutable_query());
    if (s->min > 0 || model->kdim() != model->embed_dim() || model->vdim() != model->embed_dim()) {
      const int64_t keys = s->min > 0 ? s->min : l->min;
      wire::EncodeTensor(RandomNormal({n, keys, model->kdim()}, rng), request.mutable_key());
      wire::EncodeTensor(RandomNormal({n, keys, model->vdim()}, rng), request.mutable_value());
    }
  }
  for (auto [path, field] : std::vector<std::pair<std::string, v1::Tensor*>>{
           {absl::GetFlag(FLAGS_key_padding_mask), request.mutable_key_padding_mask()},
           {absl::GetFlag(FLAGS_attn_mask), request.mutable_attn_mask()}}) {
    const absl::Status st = LoadInto(path, field);
    if (!st.ok()) return Fail(std::string(st.message()));
  }
  if (absl::GetFlag(FLAGS_key_padding_mask).empty()) request.clear_key_padding_mask();
  if (absl::GetFlag(FLAGS_attn_mask).empty()) request.clear_attn_mask();
  request.set_is_causal(absl::GetFlag(FLAGS_is_causal));
  request.set_need_weights(absl::GetFlag(FLAGS_need_weights) ||
                           !absl::GetFlag(FLAGS_weights_output).empty());
  request.set_per_head_weights(absl::GetFlag(FLAGS_per_head_weights));
  if (!absl::GetFlag(FLAGS_output_dtype).empty()) {
    auto dtype = ParseDType(absl::GetFlag(FLAGS_output_dtype));
    if (!dtype.ok() || *dtype == DType::kBool) {
      return Fail("--output_dtype must be float32, bfloat16 or float16", 2);
    }
    request.set_output_dtype(wire::ToProtoDType(*dtype));
  }

  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::GetFlag(FLAGS_deadline_ms));
  v1::InferResponse response;
  const absl::Time start = absl::Now();
  const grpc::Status status = stub->Infer(&ctx, request, &response);
  const double rtt_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  if (!status.ok()) return Fail(absl::StrCat("Infer failed: ", RpcError(status)));
  auto output = wire::DecodeTensorCopy(response.output(), "output");
  if (!output.ok()) return Fail(std::string(output.status().message()));
  std::printf("request_id  %s\n", response.request_id().c_str());
  std::printf(
      "query       %s\n",
      ShapeToString({request.query().shape().begin(), request.query().shape().end()}).c_str());
  std::printf("output      %s %s\n", ShapeToString(output->shape()).c_str(),
              std::string(DTypeName(output->dtype())).c_str());
  std::printf("  %s\n", Summarize(*output).c_str());
  std::optional<Tensor> weights;
  if (response.has_attn_weights()) {
    auto w = wire::DecodeTensorCopy(response.attn_weights(), "attn_weights");
    if (!w.ok()) return Fail(std::string(w.status().message()));
    weights = std::move(*w);
    std::printf("attn_weights %s\n  %s\n", ShapeToString(weights->shape()).c_str(),
                Summarize(*weights).c_str());
  }
  std::printf("server      queue %ld us, compute %ld us, batch of %d request(s)\n",
              static_cast<long>(response.queue_us()), static_cast<long>(response.compute_us()),
              response.batch_requests());
  std::printf("round trip  %.3f ms\n", rtt_ms);
  if (!absl::GetFlag(FLAGS_output).empty()) {
    const absl::Status s = WriteNpy(absl::GetFlag(FLAGS_output), *output);
    if (!s.ok()) return Fail(std::string(s.message()));
  }
  if (!absl::GetFlag(FLAGS_weights_output).empty() && weights) {
    const absl::Status s = WriteNpy(absl::GetFlag(FLAGS_weights_output), *weights);
    if (!s.ok()) return Fail(std::string(s.message()));
  }
  return 0;
}

int Models() {
  auto stub = Stub();
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::GetFlag(FLAGS_deadline_ms));
  v1::ListModelsResponse response;
  const grpc::Status status = stub->ListModels(&ctx, {}, &response);
  if (!status.ok()) return Fail(absl::StrCat("ListModels failed: ", RpcError(status)));
  std::printf("%-16s %6s %5s %5s %5s %5s %7s %9s %9s | %9s %10s %9s %10s\n", "name", "embed",
              "heads", "kdim", "vdim", "bias", "bias_kv", "zero_attn", "compute", "max_batch",
              "max_tokens", "delay_us", "max_queue");
  for (const v1::ModelInfo& m : response.models()) {
    const std::string name = m.name() + (m.is_default() ? " *" : "");
    std::printf("%-16s %6ld %5ld %5ld %5ld %5s %7s %9s %9s | %9ld %10ld %9ld %10ld\n", name.c_str(),
                static_cast<long>(m.embed_dim()), static_cast<long>(m.num_heads()),
                static_cast<long>(m.kdim()), static_cast<long>(m.vdim()), m.bias() ? "yes" : "no",
                m.add_bias_kv() ? "yes" : "no", m.add_zero_attn() ? "yes" : "no",
                m.compute_dtype() == v1::DATA_TYPE_BFLOAT16 ? "bfloat16" : "float32",
                static_cast<long>(m.batching().max_batch_size()),
                static_cast<long>(m.batching().max_batch_tokens()),
                static_cast<long>(m.batching().max_queue_delay_us()),
                static_cast<long>(m.batching().max_queue_size()));
  }
  std::printf("(* = default model)\n");
  return 0;
}

int Health() {
  // pick_first: client-side health checking would turn a NOT_SERVING answer
  // into a failed call.
  auto stub =
      grpc::health::v1::Health::NewStub(MakeChannel(absl::GetFlag(FLAGS_server), "pick_first"));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::GetFlag(FLAGS_deadline_ms));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&ctx, request, &response);
  if (!status.ok()) return Fail(absl::StrCat("health check failed: ", RpcError(status)));
  const std::string name =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  std::printf("%s\n", name.c_str());
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

SessionCommandOptions SessionOptionsFromFlags() {
  SessionCommandOptions o;
  o.target = absl::GetFlag(FLAGS_server);
  o.lb_policy = absl::GetFlag(FLAGS_lb_policy);
  o.model = absl::GetFlag(FLAGS_model);
  o.deadline_ms = absl::GetFlag(FLAGS_deadline_ms);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.tokens = absl::GetFlag(FLAGS_tokens);
  o.chunk = absl::GetFlag(FLAGS_chunk);
  o.sessions = absl::GetFlag(FLAGS_sessions);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.context = absl::GetFlag(FLAGS_context);
  o.json = absl::GetFlag(FLAGS_json);
  return o;
}

int Load() {
  if (absl::GetFlag(FLAGS_sessions) > 0) return RunDecodeLoad(SessionOptionsFromFlags());
  LoadOptions o;
  o.target = absl::GetFlag(FLAGS_server);
  o.lb_policy = absl::GetFlag(FLAGS_lb_policy);
  o.model = absl::GetFlag(FLAGS_model);
  o.deadline_ms = absl::GetFlag(FLAGS_deadline_ms);
  o.concurrency.clear();
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
    int v;
    if (!absl::SimpleAtoi(c, &v) || v < 1) return Fail("--concurrency: expected e.g. 1,8,64", 2);
    o.concurrency.push_back(v);
  }
  if (!absl::ParseDuration(absl::GetFlag(FLAGS_duration), &o.duration)) {
    return Fail("--duration: expected e.g. 10s or 500ms", 2);
  }
  o.requests = absl::GetFlag(FLAGS_requests);
  o.rate = absl::GetFlag(FLAGS_rate);
  if (o.rate < 0) return Fail("--rate: expected requests per second >= 0", 2);
  o.rpc = absl::GetFlag(FLAGS_rpc);
  o.protocol = absl::GetFlag(FLAGS_protocol);
  o.batch = absl::GetFlag(FLAGS_batch);
  auto l = ParseRange(absl::GetFlag(FLAGS_seq_len));
  auto s = ParseRange(absl::GetFlag(FLAGS_kv_seq_len));
  if (!l.ok()) return Fail(absl::StrCat("--seq_len: ", l.status().message()), 2);
  if (!s.ok()) return Fail(absl::StrCat("--kv_seq_len: ", s.status().message()), 2);
  o.seq_len = *l;
  o.kv_seq_len = *s;
  o.pad_share = absl::GetFlag(FLAGS_pad_share);
  o.is_causal = absl::GetFlag(FLAGS_is_causal);
  o.need_weights = absl::GetFlag(FLAGS_need_weights);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.progress = isatty(STDERR_FILENO) != 0;
  auto results = RunLoad(o);
  if (!results.ok()) return Fail(std::string(results.status().message()));
  std::printf("%s", FormatTable(*results).c_str());
  for (auto [path, text] : std::vector<std::pair<std::string, std::string>>{
           {absl::GetFlag(FLAGS_csv), FormatCsv(*results)},
           {absl::GetFlag(FLAGS_json), FormatJson(*results)}}) {
    if (path.empty()) continue;
    std::ofstream out(path);
    out << text;
    if (!out) return Fail(absl::StrCat("cannot write ", path));
  }
  int64_t errors = 0;
  for (const LevelResult& r : *results) errors += r.total_errors();
  return errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace attention::client

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "attention-client {infer|models|health|load|session} [--flags]\n"
      "  infer   send one request (inputs from .npy files or random) and print the result\n"
      "  models  list the served models and their batching settings\n"
      "  health  check grpc.health.v1; exit 0 only when SERVING\n"
      "  load    closed-loop load generator: throughput and latency per concurrency level\n"
      "          (--sessions N: a decode load of N sessions stepping one token at a time)\n"
      "  session append a generated sequence to a session and check it against Infer");
  absl::FlagsUsageConfig usage;  // --help lists this binary's own flags.
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "cli/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] { return std::string("attention-client " ATTENTION_VERSION "\n"); };
  absl::SetFlagsUsageConfig(usage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    if (args.size() > 2) {
      std::cerr << "attention-client: unexpected argument '" << args[2]
                << "' (flags are --name=value; see --help)\n";
    }
    std::cerr << absl::ProgramUsageMessage() << "\n";
    return 2;
  }
  const std::string command = args[1];
  attention::client::ChannelSecurity security;
  security.tls = absl::GetFlag(FLAGS_tls);
  security.ca_file = absl::GetFlag(FLAGS_tls_ca_file);
  security.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  security.key_file = absl::GetFlag(FLAGS_tls_key_file);
  security.server_name = absl::GetFlag(FLAGS_tls_server_name);
  auto token = attention::client::ReadToken(absl::GetFlag(FLAGS_token_file));
  absl::Status secured = token.status();
  if (token.ok()) {
    security.token = *token;
    secured = attention::client::SetChannelSecurity(security);
  }
  if (!secured.ok()) {
    std::cerr << secured.message() << "\n";
    return 2;
  }
  const absl::Status target = attention::client::TargetCheck::Check(absl::GetFlag(FLAGS_server));
  if (!target.ok()) {
    std::cerr << "attention-client: " << target.message() << "\n";
    return 2;
  }
  attention::client::SetMaxMessageBytes(absl::GetFlag(FLAGS_max_message_bytes));
  if (command == "infer") return attention::client::Infer();
  if (command == "models") return attention::client::Models();
  if (command == "health") return attention::client::Health();
  if (command == "load") return attention::client::Load();
  if (command == "session") {
    return attention::client::RunSessionCheck(attention::client::SessionOptionsFromFlags());
  }
  std::cerr << "unknown subcommand '" << command << "'\n" << absl::ProgramUsageMessage() << "\n";
  return 2;
}
