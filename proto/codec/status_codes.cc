#include "proto/codec/status_codes.h"

#include <optional>
#include <string>

#include "core/retry_after.h"

namespace attention::wire {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // grpc-message travels percent-encoded (up to 3 bytes a byte) in trailing
  // metadata, 8 KiB by default: a longer one turns the error into
  // RESOURCE_EXHAUSTED on the client.
  constexpr size_t kMaxMessageBytes = 2048;
  absl::string_view message = status.message();
  std::string text(message.substr(0, kMaxMessageBytes));
  if (message.size() > kMaxMessageBytes) text += "... (message cut)";
  if (text.empty()) text = "error";  // Triton's clients take an empty message for success.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::move(text));
}

grpc::Status ToGrpcStatus(const absl::Status& status, grpc::ServerContextBase* context) {
  if (const std::optional<absl::Duration> after = RetryAfterOf(status); after.has_value()) {
    context->AddTrailingMetadata("grpc-retry-pushback-ms",
                                 std::to_string(absl::ToInt64Milliseconds(*after)));
  }
  return ToGrpcStatus(status);
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
