// File: client/cli/load_generator.h
//
// A load generator in the manner of Triton's perf_analyzer: for each
// concurrency level, that many workers each keep one request in flight
// (unary calls, or one bidi stream per worker), for a duration or a number
// of requests, or (with `rate`) send requests on a fixed schedule, at most
// that many in flight; a stream the server closes is reopened and its request in
// flight re-sent. It measures client-side latency percentiles, throughput,
// errors by status code, and the server's own split (queue vs compute, and
// batch size, from the response timing fields). Every response's shape is
// checked; a mismatch counts as an error.
#ifndef ATTENTION_CLIENT_CLI_LOAD_GENERATOR_H_
#define ATTENTION_CLIENT_CLI_LOAD_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace attention::client {

struct Range {
  int64_t min = 0, max = 0;  // Inclusive; min == max for a fixed value.
};

// "64" or "16:128".
absl::StatusOr<Range> ParseRange(const std::string& text);

struct LevelResult;

struct LoadOptions {
  std::string target = "localhost:50051";
  std::string lb_policy;  // E.g. "round_robin".
  std::string model;      // Empty: the default model.
  int64_t deadline_ms = 10000;
  std::vector<int> concurrency = {1};
  absl::Duration duration = absl::Seconds(10);
  int64_t requests = 0;  // Per level; > 0 replaces the duration.
  // Requests per second in all, sent on a fixed schedule by the level's
  // workers (an open loop; latency counts from each request's due time);
  // 0: a closed loop, each worker sending its next request once answered.
  double rate = 0;
  std::string rpc = "unary";  // "unary" or "stream".
  // "attention" (attention.v1 Infer / InferStream) or "kserve" (the Open
  // Inference Protocol's ModelInfer / ModelStreamInfer, raw contents).
  std::string protocol = "attention";
  int64_t batch = 1;  // N per request.
  Range seq_len = {128, 128};
  Range kv_seq_len = {0, 0};  // 0: self-attention.
  double pad_share = 0.0;     // Share of each request's keys masked as padding.
  bool is_causal = false;
  bool need_weights = false;
  uint32_t seed = 1;
  bool progress = false;  // Live progress on stderr.
  // Called from RunLoad's thread as each level starts (its index from 0)
  // and as it ends (its result); empty: not called.
  std::function<void(int level, int concurrency)> on_level_start;
  std::function<void(const LevelResult&)> on_level_done;
};

struct LevelResult {
  int concurrency = 0;
  int64_t ok = 0;
  std::map<std::string, int64_t> errors;  // By status code name (or SHAPE_MISMATCH).
  // --rpc stream: streams opened again after the server closed one
  // (UNAVAILABLE), their request re-sent (JSON only).
  int64_t reopens = 0;
  double seconds = 0;
  double requests_per_s = 0;
  double tokens_per_s = 0;  // Query tokens.
  double p50_ms = 0, p90_ms = 0, p95_ms = 0, p99_ms = 0, max_ms = 0;
  double queue_us = 0, compute_us = 0, batch_requests = 0;  // Means over OK responses.
  // Median of (round trip - server compute): what the server, gRPC and the
  // network add to the computation; an upper bound of the server overhead.
  double overhead_p50_us = 0;

  int64_t total_errors() const;
};

// Runs every concurrency level in turn. Fails (without running) if the
// model cannot be described, or the options are inconsistent.
absl::StatusOr<std::vector<LevelResult>> RunLoad(const LoadOptions& options);

// The results as an aligned text table (its header line and one row per
// level: FormatTable is the header and every row), CSV, or a JSON array.
std::string FormatTableHeader();
std::string FormatTableRow(const LevelResult& result);
std::string FormatTable(const std::vector<LevelResult>& results);
std::string FormatCsv(const std::vector<LevelResult>& results);
std::string FormatJson(const std::vector<LevelResult>& results);

}  // namespace attention::client

#endif  // ATTENTION_CLIENT_CLI_LOAD_GENERATOR_H_
