// File: server/frontends/rest/rest_body_budget.h
//
// RestBodyBudget: REST's counterpart of gRPC's resource quota. It bounds the
// memory of request bodies read and being parsed, before the in-flight
// budget admits what was parsed: a body is refused by its head, before a
// byte of it is read, when its Content-Length does not fit what is free, and
// is charged as its bytes arrive (whatever its framing: a head that declares
// a large body and sends nothing holds nothing), at kJsonCharge times its bytes for JSON (the body
// and the tensor read in place from it: at most 3 times the body, for `[0,0,...]`) and
// kBinaryCharge for the binary tensors after a body's JSON header (Inference-Header-Content-Length
// bytes, charged as JSON). A body the budget cannot take is refused with 429, unread
// (HttpConnection closes the connection after the answer, dropping what the client still sends). A
// body with a Content-Encoding is charged its bytes once while held (kEncodedCharge), and its
// decoded size at the rates above before it is inflated (ChargeDecoded; rest_compression).
//
// Thread-safe. The budget, when given, must outlive this and every charge it
// hands out.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_BODY_BUDGET_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_BODY_BUDGET_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "server/frontends/rest/http_handler.h"
#include "server/frontends/rest/http_message.h"
#include "server/requests/inflight_budget.h"

namespace attention::server {

class RestBodyBudget {
 public:
  static constexpr int64_t kJsonCharge = 3;
  static constexpr int64_t kBinaryCharge = 2;
  static constexpr int64_t kEncodedCharge = 1;

  // `budget` may be null: bodies are then only held to the message limit
  // (HttpServerOptions::max_body_bytes).
  explicit RestBodyBudget(InflightBudget* budget) : budget_(budget) {}

  // The decision for a head that will be served: its body charged (a 429
  // refusal when the budget cannot take its declared size), and grown as it
  // is read.
  HeadDecision Admit(const HttpRequest& head) const;
  // The charge of `request`'s body decoded to `bytes` (as Admit charges a
  // body without Content-Encoding), held by what it returns (null without a
  // budget); RESOURCE_EXHAUSTED, naming the quota, when the budget cannot
  // take it.
  absl::StatusOr<std::shared_ptr<void>> ChargeDecoded(const HttpRequest& request,
                                                      uint64_t bytes) const;

 private:
  InflightBudget* const budget_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_BODY_BUDGET_H_
