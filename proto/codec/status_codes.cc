#include "proto/codec/status_codes.h"

#include <string>

namespace attention::wire {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::string_view StatusCodeName(absl::StatusCode code) {
  static constexpr absl::string_view kNames[kNumStatusCodes] = {"OK",
                                                                "CANCELLED",
                                                                "UNKNOWN",
                                                                "INVALID_ARGUMENT",
                                                                "DEADLINE_EXCEEDED",
                                                                "NOT_FOUND",
                                                                "ALREADY_EXISTS",
                                                                "PERMISSION_DENIED",
                                                                "RESOURCE_EXHAUSTED",
                                                                "FAILED_PRECONDITION",
                                                                "ABORTED",
                                                                "OUT_OF_RANGE",
                                                                "UNIMPLEMENTED",
                                                                "INTERNAL",
                                                                "UNAVAILABLE",
                                                                "DATA_LOSS",
                                                                "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < kNumStatusCodes ? kNames[i] : "UNKNOWN";
}

}  // namespace attention::wire
