// File: proto/codec/routing_key.h
//
// The session routing key: the gRPC metadata header an L7 gateway (nginx,
// HAProxy, Envoy/Istio) hashes on to send every call of a session to the
// replica holding it, and how a session id carries its key. Shared by the
// server, which checks the rules, and the clients, which follow them.
//
//   * The header is `x-attention-session` (gRPC metadata is an HTTP/2
//     header; its name is lower case).
//   * A key is 1 to kMaxRoutingKeyBytes characters of A-Z a-z 0-9 '_' '-'.
//     Clients draw 32 hex digits (128 random bits) per session, and a fresh
//     one whenever they re-create a session.
//   * A session created with a key has the id "<32 hex>.<key>", followed by
//     "@<address>" when the server advertises one; without a key, the id is
//     "<32 hex>[@<address>]" as before.
//
// Stateless functions; thread-safe.
#ifndef ATTENTION_PROTO_CODEC_ROUTING_KEY_H_
#define ATTENTION_PROTO_CODEC_ROUTING_KEY_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attention::wire {

// The metadata header carrying the routing key.
inline constexpr char kRoutingHeader[] = "x-attention-session";
inline constexpr size_t kMaxRoutingKeyBytes = 64;

// OK, or INVALID_ARGUMENT naming the header, the rule and the key (cut).
absl::Status CheckRoutingKey(absl::string_view key);

// The key a session id carries ("" if none): what follows the first '.'
// before any '@'.
absl::string_view RoutingKeyOf(absl::string_view session_id);

// The id of a session: `hex` (the server's random digits), then "." and
// `key` when given, then "@" and `address` when given.
std::string SessionIdOf(absl::string_view hex, absl::string_view key, absl::string_view address);

// A fresh key: 32 lowercase hex digits from 128 bits of getrandom(2).
std::string NewRoutingKey();

}  // namespace attention::wire

#endif  // ATTENTION_PROTO_CODEC_ROUTING_KEY_H_
