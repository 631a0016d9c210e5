#include "server/server_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

ABSL_FLAG(bool, exit_on_error, false,
          "A model folder none of whose versions loads at start (a config.json typo, a "
          "truncated file) stops the server with exit code 1. Default: it is reported (in the "
          "log and the repository index, UNAVAILABLE with the reason) and the other models "
          "serve, as a poll reports a bad folder (Triton's --exit-on-error).");

namespace attention::server {

void ConfigureUsage() {
  absl::SetProgramUsageMessage(
      "Serves multi-head attention over gRPC. attention-server [--flags]; started with no flag "
      "it serves the built-in demo model on port 50051 with metrics on 9464.");
  absl::FlagsUsageConfig usage;  // --help lists this binary's own flags.
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "server_main.cc") || absl::EndsWith(path, "server_flags.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] { return std::string("attention-server " ATTENTION_VERSION "\n"); };
  absl::SetFlagsUsageConfig(usage);
}

bool ExitOnErrorFlag() { return absl::GetFlag(FLAGS_exit_on_error); }

}  // namespace attention::server
