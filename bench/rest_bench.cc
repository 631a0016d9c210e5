// attention-rest-bench: the same inference over the Open Inference
// Protocol's gRPC ModelInfer, over REST with Triton's binary tensor
// extension, and over REST with JSON tensors, against one in-process server
// on a random model, at a fixed concurrency (closed loop). Prints one JSON
// line per protocol: requests/s, p50 and p99 latency, request and response
// bytes, and for JSON the extra client+server time per MB of JSON (its cost
// over binary).
//
//   attention-rest-bench --shape=1,128,768 --heads=12 --concurrency=8 --seconds=5
//
// Client and server share the machine's cores, for every protocol alike; the
// numbers are for comparing the protocols in one run, not absolute.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/mha_model.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server/attention_server.h"
#include "tests/fixture/http_test_client.h"
#include "tests/fixture/test_util.h"

ABSL_FLAG(std::string, shape, "1,128,768", "Query shape N,L,E.");
ABSL_FLAG(int, heads, 12, "Attention heads of the random model.");
ABSL_FLAG(int, concurrency, 8, "Requests in flight (one client thread each).");
ABSL_FLAG(double, seconds, 5, "Measured seconds per protocol (after 1 s of warm-up).");
ABSL_FLAG(int, threads, 0, "Server compute threads (0: every core).");
ABSL_FLAG(std::string, protocols, "grpc,rest_binary,rest_json", "Which to run, in order.");

namespace attention {
namespace {

using Call = std::function<bool()>;  // One request; false on any error.

struct Result {
  double rps = 0, p50_ms = 0, p99_ms = 0;
  int64_t errors = 0;
};

Result Run(const std::function<Call()>& make_client, int concurrency, double seconds) {
  std::atomic<bool> measuring{false}, stop{false};
  std::atomic<int64_t> errors{0};
  std::vector<std::vector<double>> latencies(concurrency);
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&, t] {
      Call call = make_client();
      while (!stop.load()) {
        const absl::Time start = absl::Now();
        const bool ok = call();
        if (measuring.load()) {
          if (!ok) ++errors;
          latencies[t].push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
        }
      }
    });
  }
  absl::SleepFor(absl::Seconds(1));
  measuring = true;
  const absl::Time start = absl::Now();
  absl::SleepFor(absl::Seconds(seconds));
  measuring = false;
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  stop = true;
  for (auto& th : threads) th.join();
  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  Result r;
  r.errors = errors;
  if (all.empty()) return r;
  r.rps = static_cast<double>(all.size()) / elapsed;
  r.p50_ms = all[all.size() / 2];
  r.p99_ms = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return r;
}

int Main() {
  std::vector<int64_t> shape;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_shape), ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) {
      std::fprintf(stderr, "--shape: expected N,L,E\n");
      return 2;
    }
    shape.push_back(v);
  }
  if (shape.size() != 3) {
    std::fprintf(stderr, "--shape: expected N,L,E\n");
    return 2;
  }
  const std::string dir =
      std::filesystem::temp_directory_path().string() + "/rest_bench_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto model =
      MhaModel::Random(testing::SelfAttentionSpec(shape[2], absl::GetFlag(FLAGS_heads)), 1);
  testing::WriteModelDir(**model, dir + "/bench");
  server::ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.http_port = 0;
  options.metrics_port = 0;
  options.repository.path = dir;
  options.repository.compute_threads = absl::GetFlag(FLAGS_threads) > 0
                                           ? absl::GetFlag(FLAGS_threads)
                                           : static_cast<int>(std::thread::hardware_concurrency());
  auto server = server::AttentionServer::Listen(options);
  if (!server.ok() || !(*server)->LoadModels().ok()) {
    std::fprintf(stderr, "server did not start\n");
    return 1;
  }
  const int grpc_port = (*server)->port(), http_port = (*server)->http_port();

  std::mt19937 rng(3);
  const Tensor query = testing::RandomTensor(shape, rng);
  const std::string raw(static_cast<const char*>(query.data()), query.num_bytes());
  // gRPC.
  inference::ModelInferRequest grpc_request;
  grpc_request.set_model_name("bench");
  auto* in = grpc_request.add_inputs();
  in->set_name("query");
  in->set_datatype("FP32");
  in->mutable_shape()->Assign(shape.begin(), shape.end());
  grpc_request.add_raw_input_contents(raw);
  // REST, binary: the JSON header, then the bytes.
  const nlohmann::json input = {{"name", "query"}, {"datatype", "FP32"}, {"shape", shape}};
  nlohmann::json binary_header = {{"inputs", {input}},
                                  {"parameters", {{"binary_data_output", true}}}};
  binary_header["inputs"][0]["parameters"] = {{"binary_data_size", raw.size()}};
  const std::string head = binary_header.dump();
  const std::string binary_body = head + raw;
  // REST, JSON.
  nlohmann::json json_input = input;
  json_input["data"] =
      std::vector<float>(query.as<float>(), query.as<float>() + query.num_elements());
  const std::string json_body = nlohmann::json{{"inputs", {json_input}}}.dump();
  std::atomic<size_t> json_response_bytes{0};

  const int concurrency = absl::GetFlag(FLAGS_concurrency);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  std::map<std::string, Result> results;
  for (absl::string_view protocol : absl::StrSplit(absl::GetFlag(FLAGS_protocols), ',')) {
    std::function<Call()> make;
    if (protocol == "grpc") {
      make = [&]() -> Call {
        // A channel per client thread: one HTTP/2 connection each, as REST's.
        grpc::ChannelArguments args;
        args.SetMaxReceiveMessageSize(-1);
        args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
        auto stub = inference::GRPCInferenceService::NewStub(grpc::CreateCustomChannel(
            "127.0.0.1:" + std::to_string(grpc_port), grpc::InsecureChannelCredentials(), args));
        return [&grpc_request, stub = std::shared_ptr(std::move(stub))] {
          grpc::ClientContext context;
          inference::ModelInferResponse response;
          return stub->ModelInfer(&context, grpc_request, &response).ok();
        };
      };
    } else if (protocol == "rest_binary" || protocol == "rest_json") {
      const bool binary = protocol == "rest_binary";
      make = [&, binary]() -> Call {
        auto client = std::make_shared<testing::HttpTestClient>("127.0.0.1", http_port);
        client->SetKeepAlive(true);
        client->SetTimeout(absl::Seconds(60));
        testing::HttpTestHeaders headers;
        if (binary) {
          headers.emplace_back("Inference-Header-Content-Length", std::to_string(head.size()));
        }
        return [&, client, headers, binary] {
          auto res =
              client->Post("/v2/models/bench/infer", headers, binary ? binary_body : json_body,
                           binary ? "application/octet-stream" : "application/json");
          if (res && !binary) json_response_bytes = res->body.size();
          return res && res->status == 200;
        };
      };
    } else {
      std::fprintf(stderr, "--protocols: unknown '%.*s'\n", static_cast<int>(protocol.size()),
                   protocol.data());
      return 2;
    }
    const Result r = Run(make, concurrency, seconds);
    results[std::string(protocol)] = r;
    nlohmann::json line = {{"protocol", protocol},
                           {"shape", shape},
                           {"concurrency", concurrency},
                           {"rps", r.rps},
                           {"p50_ms", r.p50_ms},
                           {"p99_ms", r.p99_ms},
                           {"errors", r.errors},
                           {"request_bytes", protocol == "grpc"        ? raw.size()
                                             : protocol == "rest_json" ? json_body.size()
                                                                       : binary_body.size()}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
  }
  if (results.count("grpc") && results.count("rest_binary") && results["rest_binary"].rps > 0) {
    std::printf("{\"grpc_over_rest_binary\": %.3f}\n",
                results["grpc"].rps / results["rest_binary"].rps);
  }
  if (results.count("rest_json") && results.count("rest_binary") && results["rest_json"].rps > 0) {
    // Extra wall time per request at saturation, per MB of JSON moved (request + response).
    const double extra_s = 1.0 / results["rest_json"].rps - 1.0 / results["rest_binary"].rps;
    const double mb = static_cast<double>(json_body.size() + json_response_bytes.load()) / 1e6;
    std::printf(
        "{\"json_request_mb\": %.3f, \"json_response_mb\": %.3f, \"json_ms_per_mb\": %.2f}\n",
        json_body.size() / 1e6, json_response_bytes.load() / 1e6, 1e3 * extra_s / mb);
  }
  (*server)->Drain();
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace attention

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gRPC against REST on one in-process server: attention-rest-bench [--flags]; see --help.");
  absl::FlagsUsageConfig usage;  // --help lists this binary's own flags.
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "rest_bench.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] { return std::string("attention-rest-bench " ATTENTION_VERSION "\n"); };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  return attention::Main();
}
