#include "client/cli/target_check.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace attention::client {
namespace {

// Resolvers whose addresses are not host:port.
constexpr const char* kOtherSchemes[] = {
    "unix:", "unix-abstract:", "vsock:", "xds:", "google-c2p:"};

absl::Status Invalid(const std::string& target, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("--server '", target, "': ", what));
}

// Splits "host:port" or "[v6]:port" into host and port ("" when absent).
// False when the text is not of that form.
bool SplitHostPort(const std::string& text, std::string* host, std::string* port, bool* has_port) {
  *has_port = false;
  port->clear();
  std::string rest;
  if (absl::StartsWith(text, "[")) {
    const size_t close = text.find(']');
    if (close == std::string::npos) return false;
    *host = text.substr(0, close + 1);
    rest = text.substr(close + 1);
  } else {
    const size_t colon = text.find(':');
    *host = text.substr(0, colon);
    rest = colon == std::string::npos ? "" : text.substr(colon);
  }
  if (host->empty() || absl::StrContains(*host, '/')) return false;
  if (rest.empty()) return true;
  if (rest[0] != ':' || absl::StrContains(rest.substr(1), ':') || absl::StrContains(rest, '/')) {
    return false;
  }
  *has_port = true;
  *port = rest.substr(1);
  return true;
}

absl::Status CheckHostPort(const std::string& target, const std::string& text, bool default_443) {
  std::string host, port;
  bool has_port;
  if (!SplitHostPort(text, &host, &port, &has_port)) {
    if (std::count(text.begin(), text.end(), ':') > 1 && !absl::StartsWith(text, "[")) {
      return Invalid(target,
                     absl::StrCat("an IPv6 address goes in brackets: '[", text, "]:50051'"));
    }
    return Invalid(target, "expected host:port, e.g. 'localhost:50051'");
  }
  if (!has_port || port.empty()) {
    return Invalid(target, absl::StrCat("no port", default_443 ? " (gRPC would use 443)" : "",
                                        ": give host:port, e.g. '", host, ":50051'"));
  }
  int number = 0;
  if (!absl::SimpleAtoi(port, &number) || number < 1 || number > 65535 ||
      !std::all_of(port.begin(), port.end(), absl::ascii_isdigit)) {
    return Invalid(target, absl::StrCat("port '", port, "': expected a number from 1 to 65535"));
  }
  return absl::OkStatus();
}

// The host:port part of a dns: target ("dns:host:port", "dns:///host:port",
// "dns://authority/host:port").
std::string DnsHostPort(const std::string& target) {
  std::string rest = target.substr(4);
  if (!absl::StartsWith(rest, "//")) return rest;
  rest = rest.substr(2);
  const size_t slash = rest.find('/');
  return slash == std::string::npos ? "" : rest.substr(slash + 1);
}

}  // namespace

absl::Status TargetCheck::Check(const std::string& target) {
  if (target.empty()) return Invalid(target, "expected host:port, e.g. 'localhost:50051'");
  const size_t scheme_end = target.find("://");
  if (scheme_end != std::string::npos && scheme_end > 0) {
    const std::string scheme = absl::AsciiStrToLower(target.substr(0, scheme_end));
    const bool scheme_like = std::all_of(scheme.begin(), scheme.end(), [](char c) {
      return absl::ascii_isalnum(c) || c == '+' || c == '.' || c == '-';
    });
    if (scheme_like && scheme != "dns") {
      for (const char* other : kOtherSchemes) {
        if (absl::StartsWith(scheme + ":", other)) return absl::OkStatus();
      }
      const std::string rest =
          std::vector<std::string>(absl::StrSplit(target.substr(scheme_end + 3), '/'))[0];
      std::string host, port;
      bool has_port = false;
      const bool split = SplitHostPort(rest, &host, &port, &has_port);
      const std::string example = split && has_port ? rest : absl::StrCat(rest, ":50051");
      const bool tls = scheme == "https" || scheme == "grpcs";
      return Invalid(target, absl::StrCat("a URL; a gRPC target is host:port: use --server ",
                                          example, tls ? " --tls" : ""));
    }
  }
  for (const char* other : kOtherSchemes) {
    if (absl::StartsWith(target, other)) return absl::OkStatus();
  }
  if (absl::StartsWith(target, "dns:")) return CheckHostPort(target, DnsHostPort(target), true);
  for (const char* scheme : {"ipv4:", "ipv6:"}) {
    if (!absl::StartsWith(target, scheme)) continue;
    for (absl::string_view address : absl::StrSplit(target.substr(5), ',')) {
      const absl::Status status = CheckHostPort(target, std::string(address), false);
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }
  return CheckHostPort(target, target, true);
}

std::optional<TargetCheck::Address> TargetCheck::FirstAddress(const std::string& target) {
  std::string text = target;
  if (absl::StartsWith(text, "dns:")) {
    text = DnsHostPort(text);
  } else if (absl::StartsWith(text, "ipv4:") || absl::StartsWith(text, "ipv6:")) {
    text = std::vector<std::string>(absl::StrSplit(text.substr(5), ','))[0];
  }
  std::string host, port;
  bool has_port;
  int number = 0;
  if (!SplitHostPort(text, &host, &port, &has_port) || !has_port ||
      !absl::SimpleAtoi(port, &number)) {
    return std::nullopt;
  }
  if (absl::StartsWith(host, "[")) host = host.substr(1, host.size() - 2);
  return Address{host, number};
}

bool TargetCheck::NamesOneServer(const std::string& target) {
  for (const char* socket : {"unix:", "unix-abstract:", "vsock:"}) {
    if (absl::StartsWith(target, socket)) return true;
  }
  std::string text = target;
  if (absl::StartsWith(text, "ipv4:") || absl::StartsWith(text, "ipv6:")) {
    if (absl::StrContains(text, ',')) return false;
    text = text.substr(5);
  }
  std::string host, port;
  bool has_port;
  if (!SplitHostPort(text, &host, &port, &has_port) || !has_port || port.empty() ||
      !std::all_of(port.begin(), port.end(), absl::ascii_isdigit)) {
    return false;
  }
  if (absl::StartsWith(host, "[")) host = host.substr(1, host.size() - 2);
  host = host.substr(0, host.find('%'));  // An IPv6 zone id ("fe80::1%eth0").
  // A numeric IPv4 or IPv6 address, not a name to resolve.
  in6_addr v6;
  in_addr v4;
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 || inet_pton(AF_INET6, host.c_str(), &v6) == 1;
}

}  // namespace attention::client
