// File: server/frontends/rest/http_exchange.cc
#include "server/frontends/rest/http_exchange.h"

#include <utility>

namespace attention::server {

HttpExchange::HttpExchange(std::shared_ptr<HttpAnswerSink> sink, std::atomic<int64_t>* outstanding)
    : outstanding_(outstanding), sink_(std::move(sink)) {
  if (outstanding_ != nullptr) outstanding_->fetch_add(1);
}

HttpExchange::~HttpExchange() {
  HttpResponse unanswered;
  unanswered.status = 500;
  unanswered.body = R"({"error":"the request was not answered"})";
  unanswered.SetHeader("Content-Type", "application/json");
  unanswered.close = true;
  Reply(std::move(unanswered));
}

void HttpExchange::Reply(HttpResponse response) {
  ReplyWith([response = std::make_shared<HttpResponse>(std::move(response))] {
    return std::move(*response);
  });
}

void HttpExchange::ReplyWith(std::function<HttpResponse()> make) {
  std::shared_ptr<HttpAnswerSink> sink;
  {
    absl::MutexLock lock(&mu_);
    sink = std::move(sink_);
    sink_ = nullptr;
    on_cancel_ = nullptr;
  }
  if (sink == nullptr) return;
  sink->Answer(std::move(make));
  sink.reset();
  if (outstanding_ != nullptr) outstanding_->fetch_sub(1);
}

void HttpExchange::OnCancel(std::function<void()> on_cancel) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled()) {
      on_cancel_ = std::move(on_cancel);
      return;
    }
  }
  if (on_cancel) on_cancel();
}

void HttpExchange::Cancel() {
  std::function<void()> on_cancel;
  {
    absl::MutexLock lock(&mu_);
    cancelled_.store(true, std::memory_order_release);
    on_cancel = std::move(on_cancel_);
    on_cancel_ = nullptr;
  }
  if (on_cancel) on_cancel();
}

}  // namespace attention::server
