// File: server/frontends/rest/rest_body_reader.cc
#include "server/frontends/rest/rest_body_reader.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "server/frontends/rest/rest_http.h"

namespace attention::server {
namespace {

absl::Status Busy(const InflightBudget& budget, int64_t asked) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "request body: REST bodies being read and parsed hold ", budget.used(), " of their ",
      budget.limit(), " bytes (the receive quota, --grpc_receive_quota_bytes), and this one needs ",
      asked, " (a JSON body counts ", RestBodyReader::kJsonCharge, " times its size, a binary one ",
      RestBodyReader::kBinaryCharge, " times); retry later"));
}

}  // namespace

bool RestBodyReader::Read(const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& reader, std::string* body,
                          std::shared_ptr<Admission>* charge) const {
  // A Content-Length past the limit is read and dropped by httplib (so the
  // client, still sending, reads the 413); a chunked or compressed body is
  // cut off at the limit and its connection closed.
  if (!HasBody(req)) return true;
  if (req.is_multipart_form_data()) {
    ReplyError(res, absl::InvalidArgumentError(
                        "Content-Type: multipart/form-data is not read here; send the request "
                        "as application/json or application/octet-stream"));
    res.status = 415;
    CloseAfterReply(res);
    return false;
  }
  // A chunked body is read chunked, whatever Content-Length says (the
  // front-end refuses the two together): charged as it grows.
  const uint64_t declared =
      req.has_header("Transfer-Encoding")
          ? 0
          : std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10);
  bool too_big = declared > static_cast<uint64_t>(max_body_);
  // A binary body's first Inference-Header-Content-Length bytes are its JSON
  // header, parsed as JSON: charged as JSON, the tensors after it as binary.
  const uint64_t json_bytes =
      req.has_header("Inference-Header-Content-Length")
          ? std::strtoull(req.get_header_value("Inference-Header-Content-Length").c_str(), nullptr,
                          10)
          : UINT64_MAX;
  auto charge_of = [json_bytes](uint64_t bytes) {
    const uint64_t json = std::min(bytes, json_bytes);
    return static_cast<int64_t>(json) * kJsonCharge +
           static_cast<int64_t>(bytes - json) * kBinaryCharge;
  };
  absl::Status busy;
  if (budget_ != nullptr && !too_big) {
    const int64_t asked = charge_of(declared);
    absl::StatusOr<std::shared_ptr<Admission>> taken = budget_->Take(asked);
    if (taken.ok()) {
      *charge = *std::move(taken);
    } else {
      // Read and dropped below (nothing kept), so that the client, still
      // sending, reads the 429, and the connection stays in step.
      busy = Busy(*budget_, asked);
    }
  }
  uint64_t seen = 0;
  bool stopped = false;
  const bool read = reader([&](const char* data, size_t n) {
    if (stopping_.load(std::memory_order_relaxed)) {
      stopped = true;
      return false;
    }
    seen += n;
    if (seen > static_cast<uint64_t>(max_body_)) {
      too_big = true;
      return false;
    }
    if (!busy.ok()) return true;  // Refused: the rest is read and dropped.
    // A chunked or compressed body grows its charge as it is read.
    const int64_t need = charge_of(seen);
    if (*charge != nullptr && need > (*charge)->bytes()) {
      if (!(*charge)->AtLeast(need).ok()) {
        busy = Busy(*budget_, need);
        std::string().swap(*body);
        charge->reset();
        return true;
      }
    }
    body->append(data, n);
    return true;
  });
  if (too_big) {
    ReplyError(res, absl::ResourceExhaustedError(
                        absl::StrCat("request body: larger than the server's limit of ", max_body_,
                                     " bytes (--max_message_bytes)")));
    res.status = 413;
    CloseAfterReply(res);
    return false;
  }
  if (stopped) {
    ReplyError(res, absl::UnavailableError("request body: the server is shutting down"));
    CloseAfterReply(res);
    return false;
  }
  if (!busy.ok()) {
    ReplyError(res, busy);
    if (!read) CloseAfterReply(res);
    return false;
  }
  if (!read) {
    ReplyError(res, absl::InvalidArgumentError("request body: could not be read whole"));
    CloseAfterReply(res);
    return false;
  }
  return true;
}

bool RestBodyReader::Drop(const httplib::Request& req, const httplib::ContentReader& reader) const {
  return DropBody(req, reader, max_body_, &stopping_);
}

void RestBodyReader::Refuse(const httplib::Request& req, httplib::Response& res,
                            const httplib::ContentReader& reader,
                            const absl::Status& status) const {
  const bool whole = Drop(req, reader);
  ReplyError(res, status);
  if (!whole) CloseAfterReply(res);
}

}  // namespace attention::server
