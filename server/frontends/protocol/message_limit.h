// File: server/frontends/protocol/message_limit.h
//
// The exact size check of an encoded response against the server's
// max_message_bytes, shared by every protocol's encoder: handlers refuse what
// their estimate says cannot be sent; this check makes sure gRPC never fails
// a send (which on a stream would end the stream). Stateless.
#ifndef ATTENTION_SERVER_FRONTENDS_PROTOCOL_MESSAGE_LIMIT_H_
#define ATTENTION_SERVER_FRONTENDS_PROTOCOL_MESSAGE_LIMIT_H_

#include <google/protobuf/message_lite.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attention::server {

// OK if `response` encodes to at most `max_bytes`; else RESOURCE_EXHAUSTED
// naming both sizes, and `response` is cleared.
inline absl::Status CheckMessageLimit(google::protobuf::MessageLite* response, int64_t max_bytes) {
  const int64_t bytes = static_cast<int64_t>(response->ByteSizeLong());
  if (bytes <= max_bytes) return absl::OkStatus();
  response->Clear();
  return absl::ResourceExhaustedError(absl::StrCat("response: ", bytes,
                                                   " bytes, over the server's --max_message_bytes ",
                                                   max_bytes, "; send less per request"));
}

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_PROTOCOL_MESSAGE_LIMIT_H_
