// File: server/frontends/rest/rest_body_budget.cc
#include "server/frontends/rest/rest_body_budget.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/frontends/rest/rest_http.h"

namespace attention::server {
namespace {

absl::Status Busy(const InflightBudget& budget, int64_t asked) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "request body: REST bodies being read and parsed hold ", budget.used(), " of their ",
      budget.limit(), " bytes (the receive quota, --grpc_receive_quota_bytes), and this one needs ",
      asked, " (a JSON body counts ", RestBodyBudget::kJsonCharge, " times its size, a binary one ",
      RestBodyBudget::kBinaryCharge, " times); retry later"));
}

// What `bytes` of `head`'s decoded body cost: a binary body's first
// Inference-Header-Content-Length bytes are its JSON header, parsed as JSON:
// charged as JSON, the tensors after it as binary.
std::function<int64_t(uint64_t)> DecodedChargeOf(const HttpRequest& head) {
  const auto header_length = head.Header("Inference-Header-Content-Length");
  const uint64_t json_bytes =
      header_length ? std::strtoull(std::string(*header_length).c_str(), nullptr, 10) : UINT64_MAX;
  return [json_bytes](uint64_t bytes) {
    const uint64_t json = std::min(bytes, json_bytes);
    return static_cast<int64_t>(json) * RestBodyBudget::kJsonCharge +
           static_cast<int64_t>(bytes - json) * RestBodyBudget::kBinaryCharge;
  };
}

}  // namespace

HeadDecision RestBodyBudget::Admit(const HttpRequest& head) const {
  HeadDecision decision;
  if (budget_ == nullptr || !head.HasBody()) return decision;
  // A body with a Content-Encoding is only held until it is decoded (which
  // ChargeDecoded charges): its bytes once.
  const auto encoding = head.Header("Content-Encoding");
  const bool encoded =
      encoding.has_value() && !encoding->empty() && !absl::EqualsIgnoreCase(*encoding, "identity");
  std::function<int64_t(uint64_t)> charge_of =
      encoded ? std::function<int64_t(uint64_t)>(
                    [](uint64_t bytes) { return static_cast<int64_t>(bytes) * kEncodedCharge; })
              : DecodedChargeOf(head);
  // Chunked: nothing declared, charged as it grows. (A Content-Length past
  // the message limit never gets here: the connection refuses it first.)
  const auto length = head.Header("Content-Length");
  const uint64_t declared = head.Header("Transfer-Encoding").has_value() || !length
                                ? 0
                                : std::strtoull(std::string(*length).c_str(), nullptr, 10);
  // Refused now if what it declares does not fit what is free, but charged
  // only as its bytes arrive: a head that declares a large body and sends
  // nothing holds nothing (it held the whole charge for the body's 60 s).
  const int64_t asked = charge_of(declared);
  if (asked > budget_->limit() - budget_->used()) {
    decision.refuse = ErrorResponse(Busy(*budget_, asked));
    return decision;
  }
  absl::StatusOr<std::shared_ptr<Admission>> taken = budget_->Take(0);
  if (!taken.ok()) {
    decision.refuse = ErrorResponse(Busy(*budget_, asked));
    return decision;
  }
  std::shared_ptr<Admission> charge = *std::move(taken);
  decision.charge = charge;
  InflightBudget* budget = budget_;
  decision.on_body_bytes = [charge, charge_of,
                            budget](uint64_t bytes) -> std::optional<HttpResponse> {
    const int64_t need = charge_of(bytes);
    if (need <= charge->bytes() || charge->AtLeast(need).ok()) return std::nullopt;
    return ErrorResponse(Busy(*budget, need));
  };
  return decision;
}

absl::StatusOr<std::shared_ptr<void>> RestBodyBudget::ChargeDecoded(const HttpRequest& request,
                                                                    uint64_t bytes) const {
  if (budget_ == nullptr) return nullptr;
  const int64_t asked = DecodedChargeOf(request)(bytes);
  absl::StatusOr<std::shared_ptr<Admission>> taken = budget_->Take(asked);
  if (!taken.ok()) return Busy(*budget_, asked);
  return std::shared_ptr<void>(*std::move(taken));
}

}  // namespace attention::server
