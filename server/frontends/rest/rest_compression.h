// File: server/frontends/rest/rest_compression.h
//
// gzip and deflate on the REST port, as Triton's HTTP clients use them
// (`request_compression_algorithm`, `response_compression_algorithm`):
//
// * Request bodies with `Content-Encoding: gzip` (or `x-gzip`) or `deflate`
//   (zlib's format; either is read from either header, as Triton reads
//   them) are inflated by InflateBody as a bounded step. The decoded size is
//   known before a byte of it is kept (the gzip trailer's size, checked
//   against the stream as it inflates, or a first pass that counts and
//   keeps nothing), held to the message limit (413, past it: a zip bomb
//   costs at most the limit, and is refused as soon as it passes it) and
//   charged (the caller's DecodedCharge) before it is allocated. A corrupt
//   or truncated stream is 400 naming Content-Encoding; other encodings are
//   refused by their head with 415 (UnsupportedCoding).
// * Responses: PreferredCoding reads Accept-Encoding (gzip or deflate, the
//   highest q above 0, gzip on a tie); CompressResponse compresses a body of
//   at least kCompressMinBytes and sets Content-Encoding and
//   `Vary: Accept-Encoding`. Called where the response is encoded (an
//   inference's off the batcher's thread).
//
// Free functions, stateless and thread-safe: each call owns its zlib
// stream. InflateBody returns the decoded bytes and the charge holding
// them, both owned by the caller.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_COMPRESSION_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_COMPRESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/frontends/rest/http_message.h"

namespace attention::server {

enum class ContentCoding { kIdentity, kGzip, kDeflate };

// Responses smaller than this are sent as they are.
inline constexpr size_t kCompressMinBytes = 1024;

// The coding of a request's body from its Content-Encoding (none or
// `identity`: kIdentity); INVALID_ARGUMENT naming the accepted ones for
// another, or for more than one.
absl::StatusOr<ContentCoding> BodyCoding(const HttpRequest& head);
// The 415 answer to BodyCoding's error, with `Accept-Encoding: gzip, deflate`.
HttpResponse UnsupportedCoding(const absl::Status& status);

// Admits `decoded_bytes` of decoded body before they are allocated: what
// holds them (null when nothing need be held), or the refusal
// (RESOURCE_EXHAUSTED).
using DecodedCharge = std::function<absl::StatusOr<std::shared_ptr<void>>(uint64_t decoded_bytes)>;

struct InflatedBody {
  std::string bytes;
  std::shared_ptr<void> charge;  // DecodedCharge's holder of `bytes`.
};

// `body` (coded `coding`, gzip or deflate) decoded, at most `max_bytes`
// (whose flag `limit_flag` names). OUT_OF_RANGE when it decodes past them
// (answer it with InflateRefusal: 413), INVALID_ARGUMENT naming
// Content-Encoding when the stream is corrupt, truncated or followed by
// other bytes, or `charge`'s error.
absl::StatusOr<InflatedBody> InflateBody(absl::string_view body, ContentCoding coding,
                                         uint64_t max_bytes, absl::string_view limit_flag,
                                         const DecodedCharge& charge);
// The answer to InflateBody's error: 413 for OUT_OF_RANGE, else as
// ErrorResponse.
HttpResponse InflateRefusal(const absl::Status& status);

// The coding the client prefers for a response (Accept-Encoding): gzip or
// deflate with the highest q above 0 (`*` stands for both), gzip on a tie;
// kIdentity without the header or when neither is acceptable.
ContentCoding PreferredCoding(const HttpRequest& request);
// Compresses `res.body` with `coding` (nothing for kIdentity) when it holds
// at least kCompressMinBytes, with Content-Encoding and
// `Vary: Accept-Encoding`. The response is unchanged (but for Vary) if zlib
// fails or the result is not smaller.
void CompressResponse(HttpResponse& res, ContentCoding coding);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_COMPRESSION_H_
