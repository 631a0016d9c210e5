// The queue of attention.v1 Infer on gRPC's async API (AsyncInferQueue,
// AsyncInferCall) where it meets the rest of the server: requests gRPC
// refuses before the application sees them (too large, unparsable) must not
// use up the calls posted to gRPC; more calls than are posted, held behind
// the compute lock, are each answered (queued or refused as the queue is
// full) and accounted; a version unloaded while its call waits still
// answers with that version; a deadline passing in the queue is counted as
// DEADLINE_EXCEEDED; calls cancelled in numbers release every byte and
// count; and a drain with those leaves nothing held.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "attention/v1/attention.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "tests/fixture/async_infer_test_util.h"
#include "tests/fixture/small_server_options.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::testing::HasSubstr;
using namespace ::attention::async_infer_testing;  // NOLINT: the file's helpers.

class AsyncInferQueueTest : public AsyncInferServerTest {};

// gRPC refuses these before the application sees them; the queue's posted
// calls must all still be there afterwards (more refusals than are posted).
TEST_F(AsyncInferQueueTest, RefusedByGrpcBeforeArrivalKeepsThePostedCalls) {
  server::ServerOptions options = SmallServerOptions("async_queue_grpc_refusals");
  options.max_message_bytes = 64 << 10;
  ASSERT_TRUE(Start(options));
  grpc::GenericStub generic(channel_);
  std::mt19937 rng(1);
  const v1::InferRequest oversized = SmallRequest(rng, 1200, "big");  // ~77 KB.
  ASSERT_GT(oversized.ByteSizeLong(), 64u << 10);
  constexpr int kRefusals = 2 * 32 + 5;
  for (int i = 0; i < kRefusals; ++i) {
    const grpc::Status too_large = InferOnce(stub_.get(), oversized);
    EXPECT_EQ(too_large.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << i;
    // Field 1 (request_id? any) with a length running past the end.
    const grpc::Status garbled = RawCall(&generic, "/attention.v1.AttentionService/Infer",
                                         std::string("\x0a\xff\xff\x03zz", 6));
    EXPECT_NE(garbled.error_code(), grpc::StatusCode::OK) << i;
    EXPECT_NE(garbled.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << i;
  }
  v1::InferResponse response;
  const grpc::Status ok = InferOnce(stub_.get(), SmallRequest(rng, 3, "after"), &response);
  EXPECT_TRUE(ok.ok()) << ok.error_code() << ": " << ok.error_message();
  EXPECT_EQ(response.request_id(), "after");
  EXPECT_TRUE(server_->Drain());
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
}

// More calls than the queue posts to gRPC, all at once behind the compute
// lock with a short model queue: each is queued or refused at once ("queue
// is full"), none waits unanswered, and all are counted.
TEST_F(AsyncInferQueueTest, ManyMoreCallsThanPostedAreEachAnswered) {
  server::ServerOptions options = OneRequestBatches("async_queue_many");
  options.repository.batching.max_queue_size = 8;
  ASSERT_TRUE(Start(options));
  constexpr int kCalls = 200;
  std::vector<std::unique_ptr<PendingCall>> calls;
  std::mt19937 rng(2);
  {
    absl::MutexLock hold(server_->repository()->compute_mutex());
    for (int i = 0; i < kCalls; ++i) {
      calls.push_back(
          StartCall(stub_.get(), SmallRequest(rng, 2, "c" + std::to_string(i)), absl::Seconds(60)));
    }
    // One held by the batcher, 8 queued: the other 191 refused while the
    // compute lock is still held.
    int refused = 0;
    ASSERT_TRUE(WaitFor([&] {
      refused = 0;
      for (auto& c : calls) refused += c->done.HasBeenNotified() ? 1 : 0;
      return refused == kCalls - 9;
    })) << refused
        << " answered while held, expected " << kCalls - 9;
  }
  int ok = 0, full = 0;
  for (auto& c : calls) {
    ASSERT_TRUE(c->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    if (c->status.ok()) {
      ++ok;
      EXPECT_EQ(c->response.request_id(), c->request.request_id());
    } else {
      EXPECT_EQ(c->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      EXPECT_THAT(c->status.error_message(), HasSubstr("queue is full"));
      ++full;
    }
  }
  EXPECT_EQ(ok, 9);
  EXPECT_EQ(full, kCalls - 9);
  EXPECT_EQ(Count(*server_, absl::StatusCode::kOk), 9);
  EXPECT_EQ(Count(*server_, absl::StatusCode::kResourceExhausted), kCalls - 9);
  EXPECT_TRUE(server_->Drain());
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
}

// A version unloaded while its call waits: the call still computes on it and
// reports it; the next call finds no version.
TEST_F(AsyncInferQueueTest, UnloadedWhileQueuedAnswersWithItsVersion) {
  server::ServerOptions options = OneRequestBatches("async_queue_unload");
  options.repository.control = server::ModelControl::kExplicit;
  ASSERT_TRUE(Start(options));
  const int64_t version = server_->repository()->Find("small")->version;
  std::mt19937 rng(3);
  PendingCall first(SmallRequest(rng, 4, "first")), second(SmallRequest(rng, 4, "second"));
  {
    absl::MutexLock hold(server_->repository()->compute_mutex());
    first.Start(stub_.get());
    ASSERT_TRUE(
        WaitFor([&] { return QueueDepth(*server_) == 0 && !first.done.HasBeenNotified(); }));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    second.Start(stub_.get());
    ASSERT_TRUE(WaitFor([&] { return QueueDepth(*server_) == 1; }));
    const absl::Status unloaded = server_->repository()->UnloadModel("small");
    ASSERT_TRUE(unloaded.ok()) << unloaded;
  }
  for (PendingCall* c : {&first, &second}) {
    ASSERT_TRUE(c->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_TRUE(c->status.ok()) << c->status.error_message();
    EXPECT_EQ(c->response.model_version(), version);
    EXPECT_EQ(c->response.output().shape_size(), 3);
  }
  EXPECT_EQ(InferOnce(stub_.get(), SmallRequest(rng, 4, "late")).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(server_->Drain());
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
}

// A deadline passing while the call waits in the model's queue: the client
// sees DEADLINE_EXCEEDED and so do the server's counts; nothing stays held.
TEST_F(AsyncInferQueueTest, DeadlinePassedWhileQueuedIsCounted) {
  ASSERT_TRUE(Start(OneRequestBatches("async_queue_deadline")));
  std::mt19937 rng(4);
  PendingCall first(SmallRequest(rng, 4, "first")), late(SmallRequest(rng, 4, "late"));
  late.context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  {
    absl::MutexLock hold(server_->repository()->compute_mutex());
    first.Start(stub_.get());
    ASSERT_TRUE(WaitFor([&] { return QueueDepth(*server_) == 0; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    late.Start(stub_.get());
    ASSERT_TRUE(late.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_EQ(late.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_TRUE(first.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(first.status.ok());
  EXPECT_TRUE(WaitFor([&] { return Count(*server_, absl::StatusCode::kDeadlineExceeded) == 1; }))
      << Count(*server_, absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(WaitFor([&] { return server_->service().inflight_bytes() == 0; }));
  EXPECT_TRUE(server_->Drain());
}

// Many calls cancelled by their clients while queued: every one is answered
// (CANCELLED) once the batcher drops it, counted, and releases its bytes; the
// in-flight gauge returns to 0 and the drain is idle.
TEST_F(AsyncInferQueueTest, CancelledInNumbersReleaseEverything) {
  ASSERT_TRUE(Start(OneRequestBatches("async_queue_cancel_many")));
  constexpr int kCalls = 80;
  std::vector<std::unique_ptr<PendingCall>> calls;
  std::mt19937 rng(5);
  {
    absl::MutexLock hold(server_->repository()->compute_mutex());
    for (int i = 0; i < kCalls; ++i) {
      calls.push_back(StartCall(stub_.get(), SmallRequest(rng, 2, "x" + std::to_string(i))));
      // The first alone: the batcher takes it and waits for the compute lock.
      if (i == 0) {
        ASSERT_TRUE(WaitFor([&] { return QueueDepth(*server_) == 0; }));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    ASSERT_TRUE(WaitFor([&] { return QueueDepth(*server_) == kCalls - 1; }))
        << QueueDepth(*server_);
    for (int i = 1; i < kCalls; ++i) calls[i]->context.TryCancel();
    for (int i = 1; i < kCalls; ++i) calls[i]->done.WaitForNotification();
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  ASSERT_TRUE(calls[0]->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(calls[0]->status.ok());
  EXPECT_TRUE(WaitFor([&] { return Count(*server_, absl::StatusCode::kCancelled) == kCalls - 1; }))
      << "cancelled " << Count(*server_, absl::StatusCode::kCancelled) << ", ok "
      << Count(*server_, absl::StatusCode::kOk) << ", deadline "
      << Count(*server_, absl::StatusCode::kDeadlineExceeded) << ", queue depth "
      << QueueDepth(*server_);
  EXPECT_TRUE(WaitFor([&] { return server_->service().inflight_bytes() == 0; }))
      << server_->service().inflight_bytes();
  EXPECT_TRUE(WaitFor([&] { return server_->metrics().inflight_requests().Value() == 0; }))
      << server_->metrics().inflight_requests().Value();
  EXPECT_TRUE(server_->Drain());
}

// The in-flight byte budget: calls held behind the compute lock keep their
// bytes until answered; one more is refused at once naming the flag; every
// byte comes back.
TEST_F(AsyncInferQueueTest, InflightBudgetRefusesAndReleases) {
  server::ServerOptions options = OneRequestBatches("async_queue_budget");
  options.max_inflight_bytes = 4000;  // Two calls of ~1.6 KB each, not three.
  options.max_batch_working_bytes = 64 << 20;
  ASSERT_TRUE(Start(options));
  std::mt19937 rng(6);
  PendingCall first(SmallRequest(rng, 4, "first")), second(SmallRequest(rng, 4, "second"));
  {
    absl::MutexLock hold(server_->repository()->compute_mutex());
    first.Start(stub_.get());
    ASSERT_TRUE(WaitFor(
        [&] { return QueueDepth(*server_) == 0 && server_->service().inflight_bytes() > 0; }));
    second.Start(stub_.get());
    ASSERT_TRUE(WaitFor([&] { return QueueDepth(*server_) == 1; }));
    const grpc::Status third = InferOnce(stub_.get(), SmallRequest(rng, 4, "third"));
    EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(third.error_message(), HasSubstr("max_inflight_bytes"));
  }
  for (PendingCall* c : {&first, &second}) {
    ASSERT_TRUE(c->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_TRUE(c->status.ok()) << c->status.error_message();
  }
  EXPECT_TRUE(WaitFor([&] { return server_->service().inflight_bytes() == 0; }))
      << server_->service().inflight_bytes();
  EXPECT_TRUE(InferOnce(stub_.get(), SmallRequest(rng, 4, "after")).ok());
  EXPECT_TRUE(server_->Drain());
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
}

// Clients calling, cancelling and timing out at random while the server
// drains with a short timeout: the drain ends, every call gets a status,
// and every byte is released.
TEST_F(AsyncInferQueueTest, DrainUnderChurnEndsAndReleasesEverything) {
  for (int round = 0; round < 3; ++round) {
    server::ServerOptions options = SmallServerOptions("async_queue_churn");
    options.drain_timeout = absl::Milliseconds(200);
    options.repository.batching.max_queue_delay_us = 2000;
    ASSERT_TRUE(Start(options));
    std::atomic<bool> stop{false};
    std::atomic<int> answered{0}, started{0};
    std::vector<std::thread> clients;
    for (int t = 0; t < 4; ++t) {
      clients.emplace_back([&, t] {
        auto stub = v1::AttentionService::NewStub(channel_);
        std::mt19937 rng(100 * round + t);
        while (!stop.load()) {
          std::vector<std::unique_ptr<PendingCall>> calls;
          for (int i = 0; i < 16; ++i) {
            v1::InferRequest request = SmallRequest(rng, 1 + static_cast<int>(rng() % 8), "r");
            calls.push_back(
                StartCall(stub.get(), std::move(request), absl::Milliseconds(1 + rng() % 40)));
            ++started;
          }
          for (auto& c : calls) {
            if (rng() % 3 == 0) c->context.TryCancel();
          }
          for (auto& c : calls) {
            if (c->done.WaitForNotificationWithTimeout(absl::Seconds(30))) ++answered;
          }
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    absl::Notification drained;
    std::thread drain([&] {
      server_->Drain();
      drained.Notify();
    });
    const bool ended = drained.WaitForNotificationWithTimeout(absl::Seconds(60));
    stop = true;
    for (auto& c : clients) c.join();
    EXPECT_TRUE(ended) << "Drain hangs (round " << round << ")";
    drain.join();
    EXPECT_EQ(answered.load(), started.load());
    EXPECT_EQ(server_->service().inflight_bytes(), 0);
  }
}

}  // namespace
}  // namespace attention
