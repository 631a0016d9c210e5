#include "client/cli/grpc_log_filter.h"

#include <grpc/support/log.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <ctime>

#include "absl/strings/match.h"

namespace attention::client {
namespace {

// gRPC's own format: "E1128 04:36:30.613932921   17078 file.cc:1501] message".
void WriteAsGrpc(const gpr_log_func_args* args) {
  const char* file = args->file != nullptr ? args->file : "";
  if (const char* slash = std::strrchr(file, '/')) file = slash + 1;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  tm local{};
  localtime_r(&now.tv_sec, &local);
  char time[64];
  std::strftime(time, sizeof(time), "%m%d %H:%M:%S", &local);
  std::fprintf(stderr, "%c%s.%09ld %7ld %s:%d] %s\n", gpr_log_severity_string(args->severity)[0],
               time, now.tv_nsec, static_cast<long>(syscall(SYS_gettid)), file, args->line,
               args->message != nullptr ? args->message : "");
}

void Filter(gpr_log_func_args* args) {
  if (IsHandshakeFailure(args->message != nullptr ? args->message : "")) return;
  WriteAsGrpc(args);
}

}  // namespace

bool IsHandshakeFailure(absl::string_view message) {
  return absl::StartsWith(message, "Handshake failed") ||
         absl::StartsWith(message, "Handshaking failed");
}

void FilterGrpcLog() { gpr_set_log_function(Filter); }

}  // namespace attention::client
