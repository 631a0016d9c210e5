// File: server/frontends/rest/rest_json.h
//
// The JSON side of the KServe v2 REST protocol that is not tensors: a
// protocol message written as JSON (metadata, configuration, statistics,
// the repository index), the error body, and the HTTP status of an
// absl::Status.
//
// Messages are written with their proto field names (snake_case, as
// Triton's REST API and its tools read them), 64-bit integers as JSON
// numbers (perf_analyzer reads statistics with GetUint64, and shapes and
// dims are numbers in the REST protocol), enums by name, and every scalar
// field even when it holds its default.
//
// Stateless functions; thread-safe.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_JSON_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"

namespace attention::server {

// `message` as a JSON object.
nlohmann::json ProtoToJson(const google::protobuf::Message& message);

// {"error": "<message>"} (the status' message, or its code's name when it
// has none: an empty message reads as success to some clients).
std::string ErrorBody(const absl::Status& status);

// The HTTP status for `code`, as Triton maps its errors (NOT_FOUND 404,
// UNAVAILABLE 503, UNIMPLEMENTED 501, INTERNAL 500, invalid requests 400),
// with the codes Triton does not have mapped as gRPC's HTTP mapping does:
// UNAUTHENTICATED 401, PERMISSION_DENIED 403, DEADLINE_EXCEEDED 504 and
// RESOURCE_EXHAUSTED 429 (every such refusal here is a limit on work in
// flight or on a message's size: the client may retry, later or smaller).
int HttpStatusOf(absl::StatusCode code);

// Repository request bodies (load, unload, index) are small JSON objects,
// read in place (rest_json_reader.h: no tree, O(depth) memory) and nested
// at most this deep: a body of `[[[...` is refused at its 17th byte. Their
// size is bounded where they are read (RestBodyReader).
inline constexpr int kRepositoryBodyMaxDepth = 16;

// How many `parameters` a repository load or unload body has: {} (or empty)
// or {"parameters": {...}}; INVALID_ARGUMENT for anything else. As
// nlohmann::json read it: strict JSON, and a repeated key's last value.
// Costs about the body's bytes: call it after the caller's admin rights are
// checked, all the same.
absl::StatusOr<int> RepositoryControlParameters(const std::string& body);

// Whether a repository index body asks for ready models only: {} (or
// empty) or {"ready": true|false}; INVALID_ARGUMENT for anything else. As
// RepositoryControlParameters reads.
absl::StatusOr<bool> RepositoryIndexReady(const std::string& body);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_JSON_H_
