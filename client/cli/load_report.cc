// File: client/cli/load_report.cc
//
// The load generator's results as a table, CSV or JSON (load_generator.h).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/load_generator.h"
#include "nlohmann/json.hpp"

namespace attention::client {
namespace {

std::string ErrorsText(const LevelResult& r) {
  if (r.errors.empty()) return "0";
  std::string s;
  for (const auto& [code, count] : r.errors)
    absl::StrAppend(&s, s.empty() ? "" : " ", code, "=", count);
  return s;
}

}  // namespace

std::string FormatTableHeader() {
  return absl::StrFormat("%-11s %9s %10s %12s %8s %8s %8s %8s %8s %9s %10s %7s %12s  %s\n",
                         "concurrency", "requests", "req/s", "tokens/s", "p50_ms", "p90_ms",
                         "p95_ms", "p99_ms", "max_ms", "queue_us", "compute_us", "batch",
                         "overhead_p50", "errors");
}

std::string FormatTableRow(const LevelResult& r) {
  return absl::StrFormat(
      "%-11d %9d %10.1f %12.0f %8.3f %8.3f %8.3f %8.3f %8.3f %9.0f %10.0f %7.2f %10.0fus  %s\n",
      r.concurrency, r.ok, r.requests_per_s, r.tokens_per_s, r.p50_ms, r.p90_ms, r.p95_ms, r.p99_ms,
      r.max_ms, r.queue_us, r.compute_us, r.batch_requests, r.overhead_p50_us, ErrorsText(r));
}

std::string FormatTable(const std::vector<LevelResult>& results) {
  std::string out = FormatTableHeader();
  for (const LevelResult& r : results) absl::StrAppend(&out, FormatTableRow(r));
  return out;
}

std::string FormatCsv(const std::vector<LevelResult>& results) {
  std::string out =
      "concurrency,requests,errors,requests_per_s,tokens_per_s,p50_ms,p90_ms,p95_ms,p99_ms,"
      "max_ms,queue_us,compute_us,batch_requests,overhead_p50_us,errors_by_code\n";
  for (const LevelResult& r : results) {
    absl::StrAppend(&out, absl::StrFormat("%d,%d,%d,%.3f,%.1f,%.4f,%.4f,%.4f,%.4f,%.4f,%.1f,%.1f,"
                                          "%.3f,%.1f,\"%s\"\n",
                                          r.concurrency, r.ok, r.total_errors(), r.requests_per_s,
                                          r.tokens_per_s, r.p50_ms, r.p90_ms, r.p95_ms, r.p99_ms,
                                          r.max_ms, r.queue_us, r.compute_us, r.batch_requests,
                                          r.overhead_p50_us, ErrorsText(r)));
  }
  return out;
}

std::string FormatJson(const std::vector<LevelResult>& results) {
  nlohmann::json array = nlohmann::json::array();
  for (const LevelResult& r : results) {
    array.push_back({{"concurrency", r.concurrency},
                     {"requests", r.ok},
                     {"errors", r.errors},
                     {"reopens", r.reopens},
                     {"seconds", r.seconds},
                     {"requests_per_s", r.requests_per_s},
                     {"tokens_per_s", r.tokens_per_s},
                     {"p50_ms", r.p50_ms},
                     {"p90_ms", r.p90_ms},
                     {"p95_ms", r.p95_ms},
                     {"p99_ms", r.p99_ms},
                     {"max_ms", r.max_ms},
                     {"queue_us", r.queue_us},
                     {"compute_us", r.compute_us},
                     {"batch_requests", r.batch_requests},
                     {"overhead_p50_us", r.overhead_p50_us}});
  }
  return array.dump(2) + "\n";
}

}  // namespace attention::client
