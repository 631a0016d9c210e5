#include "proto/codec/routing_key.h"

#include <sys/random.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace attention::wire {
namespace {

bool KeyChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
}

}  // namespace

absl::Status CheckRoutingKey(absl::string_view key) {
  if (key.empty() || key.size() > kMaxRoutingKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        kRoutingHeader, ": expected 1 to ", kMaxRoutingKeyBytes, " characters, got ", key.size()));
  }
  for (size_t i = 0; i < key.size(); ++i) {
    if (!KeyChar(key[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(kRoutingHeader, ": expected only A-Z a-z 0-9 '_' '-', got '",
                       absl::CHexEscape(key.substr(0, 64)), "' (character ", i, ")"));
    }
  }
  return absl::OkStatus();
}

absl::string_view RoutingKeyOf(absl::string_view session_id) {
  const absl::string_view local = session_id.substr(0, session_id.find('@'));
  const size_t dot = local.find('.');
  return dot == absl::string_view::npos ? absl::string_view() : local.substr(dot + 1);
}

std::string SessionIdOf(absl::string_view hex, absl::string_view key, absl::string_view address) {
  std::string id(hex);
  if (!key.empty()) absl::StrAppend(&id, ".", key);
  if (!address.empty()) absl::StrAppend(&id, "@", address);
  return id;
}

std::string NewRoutingKey() {
  unsigned char bits[16];
  size_t got = 0;
  while (got < sizeof(bits)) {
    const ssize_t n = getrandom(bits + got, sizeof(bits) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bits), sizeof(bits)));
}

}  // namespace attention::wire
