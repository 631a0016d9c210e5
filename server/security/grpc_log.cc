#include "server/security/grpc_log.h"

#include <grpc/support/log.h>

#include <cstdio>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/codec/grpc_log_line.h"

namespace attention::server {
namespace {

constexpr absl::Duration kEvery = absl::Seconds(10);

// What a failed handshake's OpenSSL reason most likely means.
std::string Meaning(absl::string_view message) {
  if (absl::StrContains(message, "wrong version number") ||
      absl::StrContains(message, "http request")) {
    return ": a client speaking plaintext to this TLS port?";
  }
  if (absl::StrContains(message, "unknown ca") ||
      absl::StrContains(message, "certificate unknown") ||
      absl::StrContains(message, "bad certificate")) {
    return ": a client that does not trust this server's certificate (its CA)?";
  }
  if (absl::StrContains(message, "certificate required") ||
      absl::StrContains(message, "peer did not return a certificate")) {
    return ": a client without a certificate, which --tls_client_ca_file requires";
  }
  return "";
}

struct Throttle {
  absl::Mutex mu;
  absl::Time last ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  int64_t held ABSL_GUARDED_BY(mu) = 0;  // Failures since the last line.
};

Throttle& HandshakeThrottle() {
  static Throttle* const throttle = new Throttle();
  return *throttle;
}

void Route(gpr_log_func_args* args) {
  const absl::string_view message = args->message != nullptr ? args->message : "";
  const std::string line = HandshakeFailureLine(message);
  if (line.empty()) return wire::WriteAsGrpc(args);
  Throttle& t = HandshakeThrottle();
  int64_t more = 0;
  {
    absl::MutexLock lock(&t.mu);
    const absl::Time now = absl::Now();
    if (now - t.last < kEvery) {
      ++t.held;
      return;
    }
    t.last = now;
    more = t.held;
    t.held = 0;
  }
  std::fprintf(stderr, "%s%s\n", line.c_str(),
               more > 0 ? absl::StrCat("; ", more, " more since the last such line").c_str() : "");
}

}  // namespace

std::string HandshakeFailureLine(absl::string_view message) {
  if (!wire::IsHandshakeFailure(message)) return "";
  // The OpenSSL reason: after "SSL routines::" (OpenSSL 3), else the message.
  absl::string_view reason = message;
  if (const size_t at = message.rfind("::"); at != absl::string_view::npos) {
    reason = message.substr(at + 2);
  }
  while (!reason.empty() && (reason.back() == '.' || reason.back() == '\n')) {
    reason.remove_suffix(1);
  }
  return absl::StrCat("TLS: a client's handshake failed (", reason.substr(0, 200), Meaning(message),
                      ")");
}

void RouteGrpcLog() { gpr_set_log_function(Route); }

}  // namespace attention::server
