// File: proto/codec/status_codes.h
//
// The one place where absl::Status becomes grpc::Status. Abseil's codes are
// gRPC's codes, so the code carries over unchanged.
#ifndef ATTENTION_PROTO_CODEC_STATUS_CODES_H_
#define ATTENTION_PROTO_CODEC_STATUS_CODES_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attention::wire {

grpc::Status ToGrpcStatus(const absl::Status& status);
// The same, for a unary call answered on `context`: a retry hint on the
// status (core/retry_after.h: a rate's refusal) also goes out as the
// `grpc-retry-pushback-ms` trailer (gRFC A6), which gRPC clients with a
// retry policy honour.
grpc::Status ToGrpcStatus(const absl::Status& status, grpc::ServerContextBase* context);

// "OK", "INVALID_ARGUMENT", ... as Prometheus labels and logs spell them.
absl::string_view StatusCodeName(absl::StatusCode code);

// Number of status codes (OK .. UNAUTHENTICATED).
inline constexpr int kNumStatusCodes = 17;

}  // namespace attention::wire

#endif  // ATTENTION_PROTO_CODEC_STATUS_CODES_H_
