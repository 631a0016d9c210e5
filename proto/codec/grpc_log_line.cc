#include "proto/codec/grpc_log_line.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <ctime>

#include "absl/strings/match.h"

namespace attention::wire {

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

bool IsHandshakeFailure(absl::string_view message) {
  return absl::StartsWith(message, "Handshake failed") ||
         absl::StartsWith(message, "Handshaking failed");
}

}  // namespace attention::wire
