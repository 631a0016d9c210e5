// File: server/frontends/rest/http_exchange.h
//
// HttpExchange: the handle a handler answers one request through. Reply
// hands the response to the connection (posted to its strand, so it may be
// called from any thread, the batcher's included); once the client has gone
// (the connection saw EOF or an error while the request was computed, or
// the drain closed it) the response is dropped, and what OnCancel registered
// has been run: the front-end cancels the request it queued. cancelled()
// says whether that happened, for a CallContext's is_cancelled.
//
// Thread-safe. Held by shared_ptr by the handler; holds its connection
// (through HttpAnswerSink) until answered. An exchange dropped unanswered
// answers 500.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_HTTP_EXCHANGE_H_
#define ATTENTION_SERVER_FRONTENDS_REST_HTTP_EXCHANGE_H_

#include <atomic>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/frontends/rest/http_message.h"

namespace attention::server {

// What an exchange answers into: its connection. Answer is thread-safe.
class HttpAnswerSink {
 public:
  virtual ~HttpAnswerSink() = default;
  // `make` runs on the connection's strand (not on the answering thread).
  virtual void Answer(std::function<HttpResponse()> make) = 0;
};

class HttpExchange {
 public:
  // `outstanding`, when given, counts exchanges not yet answered (the
  // server's drain waits for it to reach 0); it must outlive the exchange.
  HttpExchange(std::shared_ptr<HttpAnswerSink> sink, std::atomic<int64_t>* outstanding);
  ~HttpExchange();
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  // Answers the request; later calls are ignored.
  void Reply(HttpResponse response);
  // Answers with what `make` returns, run on the connection's I/O thread
  // (for a cheap encoding: it then runs beside the connection's other
  // work, not on the answering thread); not run when the client is gone.
  void ReplyWith(std::function<HttpResponse()> make);
  // Runs `on_cancel` (from the connection's strand, or now when the client
  // is already gone) if the client goes before the answer. At most one.
  void OnCancel(std::function<void()> on_cancel);
  // Called by the connection when its client is gone: runs what OnCancel
  // registered.
  void Cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t>* const outstanding_;
  absl::Mutex mu_;
  std::shared_ptr<HttpAnswerSink> sink_ ABSL_GUARDED_BY(mu_);  // Null once answered.
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_HTTP_EXCHANGE_H_
