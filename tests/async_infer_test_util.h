// File: tests/async_infer_test_util.h
//
// Helpers of the async Infer tests (server_async_infer_test and its review
// files, server_async_infer_review_test and server_async_infer_memory_test):
// an in-process server on the small test
// model, a channel to it, small requests, a bounded wait, and the model's
// queue depth and request counts. Header-only; each function is
// thread-compatible, the server and stubs passed in are the caller's.
#ifndef ATTENTION_TESTS_ASYNC_INFER_TEST_UTIL_H_
#define ATTENTION_TESTS_ASYNC_INFER_TEST_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "attention/v1/attention.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "tests/server_test_util.h"
#include "tests/test_util.h"

namespace attention::async_infer_testing {

using ::attention::server::AttentionServer;
using ::attention::testing::RandomTensor;
using ::attention::testing::ToProto;

inline std::unique_ptr<AttentionServer> StartServer(server::ServerOptions options) {
  auto listened = AttentionServer::Listen(options);
  EXPECT_TRUE(listened.ok()) << listened.status();
  if (!listened.ok()) return nullptr;
  std::unique_ptr<AttentionServer> server = *std::move(listened);
  EXPECT_TRUE(server->LoadModels().ok());
  return server;
}

inline std::shared_ptr<grpc::Channel> Channel(const AttentionServer& server) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(server.port()),
                                   grpc::InsecureChannelCredentials(), args);
}

// An Infer sent with the callback stub; `done` is notified with the status.
struct PendingCall {
  grpc::ClientContext context;
  v1::InferRequest request;
  v1::InferResponse response;
  grpc::Status status;
  absl::Notification done;
  void Start(v1::AttentionService::Stub* stub) {
    stub->async()->Infer(&context, &request, &response, [this](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
  }
};

inline v1::InferRequest SmallRequest(std::mt19937& rng, int64_t length, const std::string& id) {
  v1::InferRequest r;
  r.set_model("small");
  r.set_request_id(id);
  ToProto(RandomTensor({1, length, 16}, rng), r.mutable_query());
  return r;
}

inline bool WaitFor(const std::function<bool()>& condition,
                    absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return condition();
}

inline int64_t QueueDepth(AttentionServer& server) {
  return server.repository()->Find("small")->batcher->queue_depth();
}

inline double Count(AttentionServer& server, absl::StatusCode code) {
  return server.repository()->Find("small")->metrics->requests[0][static_cast<int>(code)]->Value();
}

inline grpc::Status InferOnce(v1::AttentionService::Stub* stub, const v1::InferRequest& request,
                              v1::InferResponse* response = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::InferResponse ignored;
  return stub->Infer(&context, request, response != nullptr ? response : &ignored);
}

}  // namespace attention::async_infer_testing

#endif  // ATTENTION_TESTS_ASYNC_INFER_TEST_UTIL_H_
