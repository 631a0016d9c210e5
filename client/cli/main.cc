// attention-client: the sample client and load generator of the attention
// service.
//
//   attention-client infer  [--query q.npy ... | --batch 2 --seq_len 16] [options]
//   attention-client models                        # versions and their state
//   attention-client repository                    # the repository index
//   attention-client load MODEL | unload MODEL     # model control (explicit mode)
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
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/internal/program_name.h"
#include "absl/flags/internal/usage.h"
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
#include "client/cli/grpc_log_filter.h"
#include "client/cli/load_generator.h"
#include "client/cli/model_commands.h"
#include "client/cli/npy.h"
#include "client/cli/session_commands.h"
#include "client/cli/target_check.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "proto/codec/tensor_codec.h"

#include "client/cli/cli_flags.h"

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

// The report of a failed call of `method`, with a hint when the client has one.
std::string CallFailure(const std::string& method, const grpc::Status& status) {
  return DescribeFailure(method, status, absl::GetFlag(FLAGS_server),
                         absl::GetFlag(FLAGS_deadline_ms));
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
  request.set_model_version(absl::GetFlag(FLAGS_model_version));
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
    auto model = FetchModel(stub.get(), absl::GetFlag(FLAGS_model),
                            absl::GetFlag(FLAGS_deadline_ms), absl::GetFlag(FLAGS_server), "infer");
    if (!model.ok()) return Fail(std::string(model.status().message()));
    auto l = ParseRange(absl::GetFlag(FLAGS_seq_len));
    auto s = ParseRange(absl::GetFlag(FLAGS_kv_seq_len));
    if (!l.ok()) return Fail(absl::StrCat("--seq_len: ", l.status().message()), 2);
    if (!s.ok()) return Fail(absl::StrCat("--kv_seq_len: ", s.status().message()), 2);
    // --seq_len=0 goes to the server, which judges the empty query.
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
  if (!status.ok()) return Fail(CallFailure("Infer", status));
  auto output = wire::DecodeTensorCopy(response.output(), "output");
  if (!output.ok()) return Fail(std::string(output.status().message()));
  std::printf("request_id  %s\n", response.request_id().c_str());
  std::printf("model       version %ld\n", static_cast<long>(response.model_version()));
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

ModelCommandOptions ModelOptionsFromFlags() {
  ModelCommandOptions o;
  o.target = absl::GetFlag(FLAGS_server);
  o.lb_policy = absl::GetFlag(FLAGS_lb_policy);
  o.deadline_ms = absl::GetFlag(FLAGS_deadline_ms);
  return o;
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
  if (!status.ok()) return Fail(CallFailure("health check", status));
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
    if (!absl::SimpleAtoi(c, &v) || v < 1) {
      return Fail(absl::StrCat("--concurrency=", absl::GetFlag(FLAGS_concurrency),
                               ": expected counts of at least 1, e.g. 1,8,64"),
                  2);
    }
    o.concurrency.push_back(v);
  }
  if (!absl::ParseDuration(absl::GetFlag(FLAGS_duration), &o.duration)) {
    return Fail("--duration: expected e.g. 10s or 500ms", 2);
  }
  if (o.duration <= absl::ZeroDuration()) {
    return Fail(absl::StrCat("--duration=", absl::GetFlag(FLAGS_duration),
                             ": expected a positive duration, e.g. 10s or 500ms"),
                2);
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
  // Each level's row as it completes, after a line on stderr as it starts.
  o.on_level_start = [&](int level, int concurrency) {
    std::fprintf(stderr, "load: level %d of %zu: concurrency %d, %s\n", level + 1,
                 o.concurrency.size(), concurrency,
                 o.requests > 0 ? absl::StrCat(o.requests, " requests").c_str()
                                : absl::StrCat("for ", absl::FormatDuration(o.duration)).c_str());
  };
  bool header = false;
  o.on_level_done = [&](const LevelResult& r) {
    if (!header) std::printf("%s", FormatTableHeader().c_str());
    header = true;
    std::printf("%s", FormatTableRow(r).c_str());
    std::fflush(stdout);
  };
  auto results = RunLoad(o);
  if (!results.ok()) return Fail(std::string(results.status().message()));
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
      "attention-client {infer|models|repository|load|unload|health|session} [--flags]\n"
      "  infer        send one request (inputs from .npy files or random) and print the result\n"
      "  models       list the served models: version, state of each version, batching\n"
      "  repository   the repository index: every model version, its state and reason\n"
      "  load MODEL   load (or re-read) MODEL from the server's repository (the server runs\n"
      "               with --model_control=explicit); unload MODEL stops serving it\n"
      "  health       check grpc.health.v1; exit 0 only when SERVING\n"
      "  load         (no MODEL) load generator: throughput and latency per concurrency\n"
      "               level (--sessions N: a decode load of N sessions stepping one token)\n"
      "  session      append a generated sequence to a session and check it against Infer\n"
      "Every command takes --server HOST:PORT (default localhost:50051) and --deadline_ms.");
  absl::FlagsUsageConfig usage;  // --help lists this binary's own flags.
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "cli/cli_flags.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] { return std::string("attention-client " ATTENTION_VERSION "\n"); };
  absl::SetFlagsUsageConfig(usage);
  // --help is a question answered, not an error: usage on stdout, exit 0
  // (abseil's own handling exits 1).
  for (int i = 1; i < argc && std::string(argv[i]) != "--"; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-help" || arg == "--helpshort" || arg == "-helpshort" ||
        arg == "-h") {
      absl::flags_internal::SetProgramInvocationName(argv[0]);
      absl::flags_internal::FlagsHelp(std::cout, "cli/cli_flags.cc",
                                      absl::flags_internal::HelpFormat::kHumanReadable,
                                      absl::ProgramUsageMessage());
      return 0;
    }
  }
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  // gRPC's raw handshake-failure lines: the failed call's error says it.
  attention::client::FilterGrpcLog();
  const std::string command = args.size() > 1 ? args[1] : "";
  // load and unload take a model name; other commands nothing more.
  const size_t most = command == "load" || command == "unload" ? 3 : 2;
  if (args.size() < 2 || args.size() > most || (command == "unload" && args.size() != 3)) {
    if (args.size() > most) {
      std::cerr << "attention-client: unexpected argument '" << args[most]
                << "' (flags are --name=value; see --help)\n";
    } else if (command == "unload") {
      std::cerr << "attention-client: unload: which model? (attention-client unload MODEL)\n";
    }
    std::cerr << absl::ProgramUsageMessage() << "\n";
    return 2;
  }
  const std::string model_arg = args.size() == 3 ? args[2] : "";
  // `load MODEL` is model control; a load-generator flag beside it means the
  // name is a stray value (e.g. `--concurrency 1,8 64`).
  for (int i = 1; command == "load" && !model_arg.empty() && i < argc; ++i) {
    // Its own flags and the random inputs' it shares with infer.
    for (const char* flag : {"concurrency", "duration", "requests", "rate", "rpc", "protocol",
                             "sessions", "steps", "context", "csv", "json", "pad_share", "batch",
                             "seq_len", "kv_seq_len", "seed", "is_causal", "need_weights"}) {
      const std::string arg = argv[i], name = absl::StrCat("--", flag);
      if (arg == name || absl::StartsWith(arg, name + "=")) {
        std::cerr << "attention-client: load " << model_arg << ": load MODEL loads a model, but "
                  << name << " is a load-generator flag; to generate load, leave out '" << model_arg
                  << "' (flags are --name=value)\n";
        return 2;
      }
    }
  }
  if (const absl::Status range = attention::client::CheckFlagRanges(); !range.ok()) {
    std::cerr << "attention-client: " << range.message() << "\n";
    return 2;
  }
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
  if (command == "models") {
    return attention::client::ListModels(attention::client::ModelOptionsFromFlags());
  }
  if (command == "repository") {
    return attention::client::ShowRepository(attention::client::ModelOptionsFromFlags());
  }
  if (command == "load" && !model_arg.empty()) {
    return attention::client::LoadModel(attention::client::ModelOptionsFromFlags(), model_arg);
  }
  if (command == "unload") {
    return attention::client::UnloadModel(attention::client::ModelOptionsFromFlags(), model_arg);
  }
  if (command == "health") return attention::client::Health();
  if (command == "load") return attention::client::Load();
  if (command == "session") {
    return attention::client::RunSessionCheck(attention::client::SessionOptionsFromFlags());
  }
  std::cerr << "unknown subcommand '" << command << "'\n" << absl::ProgramUsageMessage() << "\n";
  return 2;
}
