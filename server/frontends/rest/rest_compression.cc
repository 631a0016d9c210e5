// File: server/frontends/rest/rest_compression.cc
#include "server/frontends/rest/rest_compression.h"

#include <zlib.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status_macros.h"
#include "server/frontends/rest/rest_http.h"

namespace attention::server {
namespace {

// zlib's output is taken in pieces of this size; its input fed in pieces of
// at most kFeed (avail_in is 32 bits).
constexpr size_t kPiece = 64 << 10;
constexpr size_t kFeed = size_t{1} << 30;
// Over both windows: gzip's or zlib's header, read from either coding (as
// Triton reads them).
constexpr int kEitherHeader = 15 + 32;
constexpr int kGzipHeader = 15 + 16;
constexpr int kZlibHeader = 15;

const char* NameOf(ContentCoding coding) {
  return coding == ContentCoding::kGzip ? "gzip" : "deflate";
}

absl::Status Corrupt(ContentCoding coding, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("Content-Encoding: ", NameOf(coding),
                                                 ": the body is not a whole ", NameOf(coding),
                                                 " stream (", why, ")"));
}

absl::Status TooLarge(uint64_t max_bytes, absl::string_view limit_flag) {
  return absl::OutOfRangeError(
      absl::StrCat("request body: decoded (Content-Encoding), larger than ",
                   "the server's limit of ", max_bytes, " bytes (", limit_flag, ")"));
}

// Inflates `body` whole, handing each decoded piece to `sink` (whose error
// stops it there); INVALID_ARGUMENT when the body is not one whole stream.
absl::Status Inflate(absl::string_view body, ContentCoding coding,
                     const std::function<absl::Status(const char*, size_t)>& sink) {
  z_stream z{};
  if (inflateInit2(&z, kEitherHeader) != Z_OK) return absl::InternalError("zlib: inflateInit2");
  const std::unique_ptr<z_stream, int (*)(z_stream*)> end(&z, inflateEnd);
  const std::unique_ptr<char[]> piece(new char[kPiece]);
  size_t fed = 0;
  for (;;) {
    if (z.avail_in == 0 && fed < body.size()) {
      const size_t n = std::min(body.size() - fed, kFeed);
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(body.data() + fed));
      z.avail_in = static_cast<uInt>(n);
      fed += n;
    }
    z.next_out = reinterpret_cast<Bytef*>(piece.get());
    z.avail_out = static_cast<uInt>(kPiece);
    const int rc = inflate(&z, Z_NO_FLUSH);
    const size_t produced = kPiece - z.avail_out;
    if (produced > 0) RETURN_IF_ERROR(sink(piece.get(), produced));
    if (rc == Z_STREAM_END) break;
    // No progress with room for output: the input ran out.
    if (rc == Z_BUF_ERROR) return Corrupt(coding, "it ends before the stream does");
    if (rc == Z_NEED_DICT) return Corrupt(coding, "it asks for a preset dictionary");
    if (rc == Z_MEM_ERROR) return absl::ResourceExhaustedError("zlib: out of memory inflating");
    if (rc != Z_OK) return Corrupt(coding, z.msg != nullptr ? z.msg : "zlib refused it");
  }
  const size_t left = z.avail_in + (body.size() - fed);
  if (left > 0) {
    return Corrupt(coding, absl::StrCat(left, " bytes follow its end; one stream is read"));
  }
  return absl::OkStatus();
}

// A gzip stream's decoded size as its trailer states it (ISIZE: the size
// modulo 2^32), or none when `body` is not gzip or sizes past 4 GiB are
// allowed (the trailer cannot tell them).
std::optional<uint64_t> TrailerSize(absl::string_view body, uint64_t max_bytes) {
  if (body.size() < 18 || static_cast<unsigned char>(body[0]) != 0x1f ||
      static_cast<unsigned char>(body[1]) != 0x8b || max_bytes >= (uint64_t{1} << 32)) {
    return std::nullopt;
  }
  uint64_t size = 0;
  for (int i = 1; i <= 4; ++i) {
    size = (size << 8) | static_cast<unsigned char>(body[body.size() - i]);
  }
  return size;
}

}  // namespace

absl::StatusOr<ContentCoding> BodyCoding(const HttpRequest& head) {
  const auto header = head.Header("Content-Encoding");
  if (!header.has_value()) return ContentCoding::kIdentity;
  const absl::string_view value = absl::StripAsciiWhitespace(*header);
  if (value.empty() || absl::EqualsIgnoreCase(value, "identity")) return ContentCoding::kIdentity;
  if (absl::EqualsIgnoreCase(value, "gzip") || absl::EqualsIgnoreCase(value, "x-gzip")) {
    return ContentCoding::kGzip;
  }
  if (absl::EqualsIgnoreCase(value, "deflate")) return ContentCoding::kDeflate;
  return absl::InvalidArgumentError(
      absl::StrCat("Content-Encoding: expected one of gzip, deflate or identity, got '",
                   value.substr(0, 32), "'"));
}

HttpResponse UnsupportedCoding(const absl::Status& status) {
  HttpResponse res = ErrorResponse(status);
  res.status = 415;
  res.SetHeader("Accept-Encoding", "gzip, deflate");
  return res;
}

absl::StatusOr<InflatedBody> InflateBody(absl::string_view body, ContentCoding coding,
                                         uint64_t max_bytes, absl::string_view limit_flag,
                                         const DecodedCharge& charge) {
  InflatedBody out;
  if (coding == ContentCoding::kIdentity || body.empty()) {
    out.bytes = std::string(body);
    return out;
  }
  // The decoded size before a byte of it is kept: the trailer's (checked
  // below as the stream inflates), or counted by a pass that keeps nothing.
  const std::optional<uint64_t> stated = TrailerSize(body, max_bytes);
  uint64_t size = 0;
  if (stated.has_value() && *stated <= max_bytes) {
    size = *stated;
  } else {  // A trailer past the limit may be corrupt: counted, refused as it passes.
    RETURN_IF_ERROR(Inflate(body, coding, [&](const char*, size_t n) {
      size += n;
      return size > max_bytes ? TooLarge(max_bytes, limit_flag) : absl::OkStatus();
    }));
  }
  ASSIGN_OR_RETURN(out.charge, charge(size));
  out.bytes.reserve(size);  // Pages are touched only as the bytes arrive.
  RETURN_IF_ERROR(Inflate(body, coding, [&](const char* piece, size_t n) {
    if (out.bytes.size() + n > size) {
      return Corrupt(coding,
                     absl::StrCat("it decodes to more than the ", size, " bytes its trailer says"));
    }
    out.bytes.append(piece, n);
    return absl::OkStatus();
  }));
  if (out.bytes.size() != size) {
    return Corrupt(coding, absl::StrCat("it decodes to ", out.bytes.size(),
                                        " bytes, its trailer says ", size));
  }
  return out;
}

HttpResponse InflateRefusal(const absl::Status& status) {
  HttpResponse res = ErrorResponse(status);
  if (status.code() == absl::StatusCode::kOutOfRange) res.status = 413;
  return res;
}

ContentCoding PreferredCoding(const HttpRequest& request) {
  const auto header = request.Header("Accept-Encoding");
  if (!header.has_value()) return ContentCoding::kIdentity;
  // Each coding's q (-1: not listed); RFC 9110 12.5.3.
  double gzip = -1, deflate = -1, any = -1;
  for (const absl::string_view item : absl::StrSplit(*header, ',')) {
    const std::vector<absl::string_view> parts = absl::StrSplit(item, ';');
    const absl::string_view coding = absl::StripAsciiWhitespace(parts[0]);
    double q = 1;
    for (size_t i = 1; i < parts.size(); ++i) {
      const absl::string_view p = absl::StripAsciiWhitespace(parts[i]);
      if (!absl::StartsWithIgnoreCase(p, "q=")) continue;
      if (!absl::SimpleAtod(p.substr(2), &q) || !(q >= 0 && q <= 1)) q = 0;
    }
    if (absl::EqualsIgnoreCase(coding, "gzip") || absl::EqualsIgnoreCase(coding, "x-gzip")) {
      gzip = std::max(gzip, q);
    } else if (absl::EqualsIgnoreCase(coding, "deflate")) {
      deflate = std::max(deflate, q);
    } else if (coding == "*") {
      any = std::max(any, q);
    }
  }
  if (gzip < 0) gzip = any;
  if (deflate < 0) deflate = any;
  if (gzip <= 0 && deflate <= 0) return ContentCoding::kIdentity;
  return gzip >= deflate ? ContentCoding::kGzip : ContentCoding::kDeflate;
}

void CompressResponse(HttpResponse& res, ContentCoding coding) {
  if (res.body.size() < kCompressMinBytes) return;
  res.SetHeader("Vary", "Accept-Encoding");
  if (coding == ContentCoding::kIdentity) return;
  z_stream z{};
  // The fastest level: this runs on the thread that finished the request.
  if (deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED,
                   coding == ContentCoding::kGzip ? kGzipHeader : kZlibHeader, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    return;
  }
  const std::unique_ptr<z_stream, int (*)(z_stream*)> end(&z, deflateEnd);
  std::string out;
  out.reserve(deflateBound(&z, res.body.size()));  // Pages touched only as written.
  const std::unique_ptr<char[]> piece(new char[kPiece]);
  size_t fed = 0;
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    if (z.avail_in == 0 && fed < res.body.size()) {
      const size_t n = std::min(res.body.size() - fed, kFeed);
      z.next_in = reinterpret_cast<Bytef*>(res.body.data() + fed);
      z.avail_in = static_cast<uInt>(n);
      fed += n;
    }
    z.next_out = reinterpret_cast<Bytef*>(piece.get());
    z.avail_out = static_cast<uInt>(kPiece);
    rc = deflate(&z, fed == res.body.size() ? Z_FINISH : Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) return;
    out.append(piece.get(), kPiece - z.avail_out);
  }
  if (out.size() >= res.body.size()) return;
  res.body = std::move(out);
  res.SetHeader("Content-Encoding", NameOf(coding));
}

}  // namespace attention::server
