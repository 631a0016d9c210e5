// File: server/frontends/rest/http_handler.h
//
// HttpHandler: what HttpServer calls for each request (RestFrontend is one).
// OnHead sees the request's head before a byte of its body is read past the
// head's buffer: it refuses the request there (its token, its method, the
// body's declared size against a budget), or lets the body be read, handing
// back a charge held until the handler drops it. Handle then gets the
// whole request and answers it exactly once through its HttpExchange, from
// any thread, now or later (an inference answers from the batcher's thread).
//
// Implementations must be thread-safe: OnHead and Handle run on the I/O
// threads (never block there) for many connections at once. The handler
// must outlive the HttpServer that calls it.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_HTTP_HANDLER_H_
#define ATTENTION_SERVER_FRONTENDS_REST_HTTP_HANDLER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "server/frontends/rest/http_exchange.h"
#include "server/frontends/rest/http_message.h"

namespace attention::server {

// OnHead's verdict: `refuse` answers now (the body is not read: the
// connection is closed after the answer, lingering to drop what the client
// still sends); else the body is read, and `charge` held until Handle has
// answered.
struct HeadDecision {
  std::optional<HttpResponse> refuse;
  std::shared_ptr<void> charge;  // Handed to Handle in HttpRequest::charge.
  // Called (on the strand) with the size the body would reach as its bytes
  // arrive, before they are kept: a response refuses the request there
  // (the rest of the body unread). May be empty.
  std::function<std::optional<HttpResponse>(uint64_t)> on_body_bytes;
};

class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // `head` has no body yet.
  virtual HeadDecision OnHead(const HttpRequest& head) = 0;
  // Answers `request` through `exchange` (exactly once; dropping the
  // exchange unanswered answers 500).
  virtual void Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) = 0;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_HTTP_HANDLER_H_
