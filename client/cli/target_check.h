// File: client/cli/target_check.h
//
// TargetCheck: refuses, before any call, the --server values gRPC would take
// and then fail on obscurely: a URL ("http://localhost:50051", which gRPC
// resolves as the host "http") and a host without a port (gRPC's DNS resolver
// silently uses 443). The Python and Node.js clients check targets the same
// way (client/python/attention_client/errors.py, client/node/lib/common.js).
// Stateless; every function is thread-safe.
#ifndef ATTENTION_CLIENT_CLI_TARGET_CHECK_H_
#define ATTENTION_CLIENT_CLI_TARGET_CHECK_H_

#include <optional>
#include <string>

#include "absl/status/status.h"

namespace attention::client {

class TargetCheck {
 public:
  // OK for a target gRPC reads as meant: host:port, [v6]:port,
  // dns:///host:port, ipv4:/ipv6: address lists with ports, unix:, vsock:,
  // xds: and the like. INVALID_ARGUMENT otherwise, the message starting
  // "--server '<target>': " and giving the right form (for a URL, the
  // host:port to use, and --tls for https).
  static absl::Status Check(const std::string& target);

  // The host and port of the first address of a host:port, dns: or
  // ipv4:/ipv6: target (brackets removed); nullopt for other targets.
  struct Address {
    std::string host;
    int port = 0;
  };
  static std::optional<Address> FirstAddress(const std::string& target);

  // True when `target` can only ever name one server: a numeric address
  // (1.2.3.4:5, [::1]:5, ipv4:/ipv6: with one address) or a unix:/vsock:
  // socket. False for a name the resolver may turn into several addresses
  // (localhost:5, dns:///svc:5, a headless Kubernetes service) and for
  // address lists. MakeChannel health-checks only those (see ServiceConfig).
  static bool NamesOneServer(const std::string& target);
};

}  // namespace attention::client

#endif  // ATTENTION_CLIENT_CLI_TARGET_CHECK_H_
