#include "server/server_flags.h"

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(bool, exit_on_error, false,
          "A model folder none of whose versions loads at start (a config.json typo, a "
          "truncated file) stops the server with exit code 1. Default: it is reported (in the "
          "log and the repository index, UNAVAILABLE with the reason) and the other models "
          "serve, as a poll reports a bad folder (Triton's --exit-on-error).");

namespace attention::server {
namespace {

constexpr double kNoMax = std::numeric_limits<double>::infinity();

// A numeric flag's accepted range, inclusive, and what its ends mean.
struct FlagRange {
  const char* name;
  double min;
  double max;
  const char* means;  // Shown after the range; may be "".
};

// Every numeric flag of attention-server (server_main.cc defines them).
// --max_connection_age_s, --max_connection_age_grace_s and
// --repository_poll_s are checked in server_main.cc (they take inf or
// must be > 0).
constexpr FlagRange kRanges[] = {
    {"port", 0, 65535, "0: a free port"},
    {"metrics_port", -1, 65535, "0 or -1: no metrics port"},
    {"http_port", -1, 65535, "0 or -1: no REST port"},
    {"threads", 0, 4096, "0: every core"},
    {"max_batch_size", 1, kNoMax, "1: no batching"},
    {"max_batch_tokens", 1, kNoMax, ""},
    {"max_queue_delay_us", 0, kNoMax, ""},
    {"max_queue_size", 1, kNoMax, ""},
    {"http_io_threads", 1, 1024, ""},
    {"http_max_connections", 1, kNoMax, ""},
    {"http_threads", 0, 4096, "0: --http_io_threads decides"},
    {"max_message_bytes", 1, kNoMax, ""},
    {"infer_parse_threads", 1, 64, ""},
    {"max_stream_pending", 1, kNoMax, ""},
    {"max_stream_pending_bytes", 1, kNoMax, ""},
    {"drain_timeout_s", 0, kNoMax, ""},
    {"session_memory_bytes", 0, kNoMax, "0: the memory plan's share"},
    {"max_sessions", 0, kNoMax, "0: no sessions"},
    {"max_session_tokens", 1, kNoMax, ""},
    {"session_ttl_s", 1, kNoMax, ""},
    {"max_session_ttl_s", 1, kNoMax, ""},
    {"max_sessions_per_tenant", 0, kNoMax, "0: the default share"},
    {"session_memory_per_tenant_bytes", 0, kNoMax, "0: the default share"},
    {"session_evict_grace_s", 0, kNoMax, ""},
    {"tls_reload_interval_s", 1, kNoMax, ""},
    {"max_inflight_bytes", 0, kNoMax, "0: the memory plan's share"},
    // At most DynamicBatcher::kMaxBatchWeightsBytes (a batch's attention
    // weights): more was refused by every model's load.
    {"max_batch_working_bytes", 0, 536870912, "0: the default share"},
    {"grpc_receive_quota_bytes", 0, kNoMax, "0: the memory plan's share"},
    {"memory_limit_bytes", 0, kNoMax, "0: the cgroup's or the machine's"},
    {"max_model_bytes", 0, kNoMax, "0: no limit"},
};

// An end of a range, as an integer (no exponent) when it is one.
std::string End(double v) {
  return v == static_cast<double>(static_cast<int64_t>(v)) ? absl::StrCat(static_cast<int64_t>(v))
                                                           : absl::StrCat(v);
}

std::string Range(const FlagRange& r) {
  std::string text = r.max == kNoMax ? absl::StrCat(">= ", End(r.min))
                                     : absl::StrCat(End(r.min), " to ", End(r.max));
  if (*r.means != '\0') absl::StrAppend(&text, " (", r.means, ")");
  return text;
}

}  // namespace

void ConfigureUsage() {
  absl::SetProgramUsageMessage(
      "Serves multi-head attention over gRPC and REST. attention-server [--flags]; started with "
      "no flag it serves the built-in demo model on three ports: gRPC on 50051 (--port), KServe "
      "v2 REST on 8000 (--http_port), Prometheus /metrics on 9464 (--metrics_port).");
  absl::FlagsUsageConfig usage;  // --help lists this binary's own flags.
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "server_main.cc") || absl::EndsWith(path, "server_flags.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] { return std::string("attention-server " ATTENTION_VERSION "\n"); };
  absl::SetFlagsUsageConfig(usage);
}

void ParseServerFlags(int argc, char** argv) {
  // Abseil's ParseCommandLine exits 1 after --help (a help asked for is not
  // a failure): parse without its usage handling, then handle it here.
  namespace fi = absl::flags_internal;
  fi::ParseCommandLineImpl(argc, argv, fi::ArgvListAction::kRemoveParsedArgs,
                           fi::UsageFlagsAction::kIgnoreUsage,
                           fi::OnUndefinedFlag::kAbortIfUndefined);
  const int help = fi::HandleUsageFlags(std::cout, absl::ProgramUsageMessage());
  if (help != -1) std::exit(0);
}

absl::Status CheckFlagRanges() {
  for (const FlagRange& r : kRanges) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(r.name);
    if (flag == nullptr) {
      return absl::InternalError(absl::StrCat("--", r.name, ": no such flag (server_flags.cc)"));
    }
    const std::string value = flag->CurrentValue();
    double number = 0;
    if (!absl::SimpleAtod(value, &number) || !(number >= r.min && number <= r.max)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", r.name, "=", value, ": expected ", Range(r)));
    }
  }
  return absl::OkStatus();
}

bool ExitOnErrorFlag() { return absl::GetFlag(FLAGS_exit_on_error); }

}  // namespace attention::server
