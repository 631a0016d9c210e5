// DynamicBatcher driven directly from many threads, without gRPC: what
// scripts/sanitize.sh runs under ThreadSanitizer to judge the batcher's own
// synchronisation (gRPC's, uninstrumented in Debian, cannot be judged).
#include "server/batching/dynamic_batcher.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/mha_engine.h"
#include "gtest/gtest.h"
#include "server/batching/outcome_flush.h"
#include "server/batching/pending_request.h"
#include "server/metrics/metrics.h"
#include "tests/fixture/test_util.h"

namespace attention::server {
namespace {

using ::attention::testing::RandomMask;
using ::attention::testing::RandomTensor;

// One request's tensors, its solo result, and what the batcher answered.
struct Case {
  Tensor query, kpm;
  MhaOutputs solo;
  RequestOutcome outcome;
  int answers = 0;  // Guarded by the fixture's mu.
  absl::Notification answered;
};

class DynamicBatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = MhaModel::Random(attention::testing::SelfAttentionSpec(32, 4), 7);
    ASSERT_TRUE(model.ok());
    auto engine = MhaEngine::Create(*model);
    ASSERT_TRUE(engine.ok());
    engine_ = std::move(*engine);
    model_metrics_ = metrics_.AddModel("small");
  }

  std::unique_ptr<DynamicBatcher> Start(BatchingOptions options) {
    auto batcher = DynamicBatcher::Create(engine_.get(), options, model_metrics_, &compute_mutex_,
                                          /*compute_threads=*/1);
    EXPECT_TRUE(batcher.ok()) << batcher.status();
    return batcher.ok() ? std::move(*batcher) : nullptr;
  }

  // A self-attention request of `n` items of `len` tokens with a padding mask.
  std::unique_ptr<Case> MakeCase(std::mt19937& rng, int64_t n, int64_t len) {
    auto c = std::make_unique<Case>();
    c->query = RandomTensor({n, len, 32}, rng);
    c->kpm = RandomMask({n, len}, rng, 0.3);
    auto solo = engine_->Forward(Inputs(*c));
    EXPECT_TRUE(solo.ok()) << solo.status();
    if (solo.ok()) c->solo = std::move(*solo);
    return c;
  }

  static MhaInputs Inputs(const Case& c) {
    MhaInputs in;
    in.query = c.query.view();
    in.key_padding_mask = c.kpm.view();
    return in;
  }

  // The request for `c`, answering into it.
  std::unique_ptr<PendingRequest> Request(Case* c) {
    auto request = std::make_unique<PendingRequest>();
    request->inputs = Inputs(*c);
    auto call = engine_->Validate(request->inputs);
    EXPECT_TRUE(call.ok()) << call.status();
    if (call.ok()) request->call = *call;
    request->enqueued = absl::Now();
    request->done = [this, c](RequestOutcome outcome) {
      {
        absl::MutexLock lock(&mu_);
        ++c->answers;
      }
      c->outcome = std::move(outcome);
      c->answered.Notify();
    };
    return request;
  }

  // Largest difference between the batcher's output for `c` and its solo result.
  static double Difference(const Case& c) {
    const auto* expected = c.solo.output.as<float>();
    const size_t count = c.outcome.output.bytes.size() / sizeof(float);
    if (count != static_cast<size_t>(NumElements(c.solo.output.shape()))) return INFINITY;
    double worst = 0;
    for (size_t i = 0; i < count; ++i) {
      float got;
      std::memcpy(&got, c.outcome.output.bytes.data() + i * sizeof(float), sizeof(float));
      worst = std::max(worst, static_cast<double>(std::abs(got - expected[i])));
    }
    return worst;
  }

  std::unique_ptr<MhaEngine> engine_;
  Metrics metrics_{"test"};
  const ModelMetrics* model_metrics_ = nullptr;
  absl::Mutex compute_mutex_;
  absl::Mutex mu_;
};

TEST_F(DynamicBatcherTest, ConcurrentRequestsShareBatchesAndEachGetsItsOwnResult) {
  BatchingOptions options;
  options.max_queue_delay_us = 2000;  // Long enough for the threads to meet.
  auto batcher = Start(options);
  ASSERT_NE(batcher, nullptr);
  constexpr int kThreads = 4, kPerThread = 12;
  std::vector<std::vector<std::unique_ptr<Case>>> cases(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    std::mt19937 rng(100 + t);
    for (int i = 0; i < kPerThread; ++i)
      cases[t].push_back(MakeCase(rng, 1 + i % 2, 2 + (t + i) % 9));
  }
  std::vector<std::thread> threads;
  std::atomic<int> refused{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (auto& c : cases[t]) {
        if (!batcher->Enqueue(Request(c.get())).ok()) refused.fetch_add(1);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(refused.load(), 0);
  int shared = 0;
  for (auto& per_thread : cases) {
    for (auto& c : per_thread) {
      ASSERT_TRUE(c->answered.WaitForNotificationWithTimeout(absl::Seconds(60)));
      ASSERT_TRUE(c->outcome.status.ok()) << c->outcome.status;
      EXPECT_LE(Difference(*c), 1e-6);  // Padding and neighbours change nothing.
      if (c->outcome.batch_requests > 1) ++shared;
    }
  }
  EXPECT_GT(shared, 0) << "no two requests ever shared a batch";
  batcher.reset();
  absl::MutexLock lock(&mu_);
  for (auto& per_thread : cases) {
    for (auto& c : per_thread) EXPECT_EQ(c->answers, 1);
  }
}

TEST_F(DynamicBatcherTest, StopWhileThreadsEnqueueAnswersEveryAcceptedRequestOnce) {
  auto batcher = Start(BatchingOptions{});
  ASSERT_NE(batcher, nullptr);
  constexpr int kThreads = 3, kPerThread = 20;
  std::vector<std::vector<std::unique_ptr<Case>>> cases(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    std::mt19937 rng(200 + t);
    for (int i = 0; i < kPerThread; ++i) cases[t].push_back(MakeCase(rng, 1, 1 + i % 5));
  }
  std::vector<std::vector<bool>> accepted(kThreads, std::vector<bool>(kPerThread));
  absl::Notification go;
  std::atomic<int> accepted_count{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      go.WaitForNotification();
      for (int i = 0; i < kPerThread; ++i) {
        const absl::Status s = batcher->Enqueue(Request(cases[t][i].get()));
        accepted[t][i] = s.ok();
        if (s.ok()) {
          accepted_count.fetch_add(1);
        } else {
          EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
        }
      }
    });
  }
  go.Notify();
  // Stops once some requests are in, while the threads are still sending.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (accepted_count.load() < kThreads && absl::Now() < give_up) std::this_thread::yield();
  batcher->Stop();
  for (auto& thread : threads) thread.join();
  batcher.reset();  // Computes what was queued, then joins.
  absl::MutexLock lock(&mu_);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      EXPECT_EQ(cases[t][i]->answers, accepted[t][i] ? 1 : 0) << t << "/" << i;
    }
  }
}

TEST_F(DynamicBatcherTest, CancelledAndExpiredRequestsAreAnsweredWithoutCompute) {
  BatchingOptions options;
  options.max_queue_delay_us = 200000;  // They wait long enough to be dropped.
  auto batcher = Start(options);
  ASSERT_NE(batcher, nullptr);
  std::mt19937 rng(300);
  auto cancelled = MakeCase(rng, 1, 4), expired = MakeCase(rng, 1, 4), fine = MakeCase(rng, 1, 4);
  std::atomic<bool> cancel{false};
  auto request = Request(cancelled.get());
  request->is_cancelled = [&cancel] { return cancel.load(); };
  ASSERT_TRUE(batcher->Enqueue(std::move(request)).ok());
  request = Request(expired.get());
  request->deadline = absl::Now() - absl::Milliseconds(1);
  ASSERT_TRUE(batcher->Enqueue(std::move(request)).ok());
  // Cancelled from another thread while it waits in the queue.
  std::thread canceller([&cancel] { cancel.store(true); });
  canceller.join();
  ASSERT_TRUE(batcher->Enqueue(Request(fine.get())).ok());
  for (Case* c : {cancelled.get(), expired.get(), fine.get()}) {
    ASSERT_TRUE(c->answered.WaitForNotificationWithTimeout(absl::Seconds(60)));
  }
  EXPECT_EQ(cancelled->outcome.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(expired->outcome.status.code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(fine->outcome.status.ok()) << fine->outcome.status;
  EXPECT_LE(Difference(*fine), 1e-6);
}

// The batcher sleeps until its oldest request's delay runs out and is woken
// only by a request that completes a batch or expires sooner (not by every
// request): with a delay of ten minutes, both must still happen at once.
TEST_F(DynamicBatcherTest, AFullBatchGoesAtOnceThoughTheDelayIsLong) {
  BatchingOptions options;
  options.max_batch_size = 4;
  options.max_queue_delay_us = int64_t{600} * 1000 * 1000;
  auto batcher = Start(options);
  ASSERT_NE(batcher, nullptr);
  std::mt19937 rng(400);
  std::vector<std::unique_ptr<Case>> cases;
  for (int i = 0; i < 4; ++i) {
    cases.push_back(MakeCase(rng, 1, 4));
    ASSERT_TRUE(batcher->Enqueue(Request(cases.back().get())).ok());
  }
  for (const auto& c : cases) {
    ASSERT_TRUE(c->answered.WaitForNotificationWithTimeout(absl::Seconds(60)));
    ASSERT_TRUE(c->outcome.status.ok()) << c->outcome.status;
    EXPECT_EQ(c->outcome.batch_requests, 4);
    EXPECT_LE(Difference(*c), 1e-6);
  }
}

TEST_F(DynamicBatcherTest, ARequestExpiringBeforeTheBatcherWakesIsAnsweredAtItsDeadline) {
  BatchingOptions options;
  options.max_queue_delay_us = int64_t{600} * 1000 * 1000;
  auto batcher = Start(options);
  ASSERT_NE(batcher, nullptr);
  std::mt19937 rng(500);
  auto waiting = MakeCase(rng, 1, 4), expiring = MakeCase(rng, 1, 4);
  ASSERT_TRUE(batcher->Enqueue(Request(waiting.get())).ok());
  auto request = Request(expiring.get());
  request->deadline = absl::Now() + absl::Milliseconds(20);
  ASSERT_TRUE(batcher->Enqueue(std::move(request)).ok());
  ASSERT_TRUE(expiring->answered.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(expiring->outcome.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(waiting->answered.HasBeenNotified());
  batcher.reset();  // Computes the waiting request before its case goes.
  ASSERT_TRUE(waiting->answered.HasBeenNotified());
  EXPECT_TRUE(waiting->outcome.status.ok()) << waiting->outcome.status;
}

// Counts its Flush() calls and the answers given before each.
class CountingFlush final : public OutcomeFlush {
 public:
  explicit CountingFlush(const std::atomic<int>* answers) : answers_(answers) {}
  void Flush() override {
    absl::MutexLock lock(&mu_);
    seen_.push_back(answers_->load());
  }
  std::vector<int> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  const std::atomic<int>* const answers_;
  absl::Mutex mu_;
  std::vector<int> seen_ ABSL_GUARDED_BY(mu_);
};

TEST_F(DynamicBatcherTest, EachOutcomeFlushIsToldOnceAfterItsBatchIsAnswered) {
  BatchingOptions options;
  options.max_batch_size = 8;
  options.max_queue_delay_us = 1000000;  // Only a full batch goes.
  auto batcher = Start(options);
  ASSERT_NE(batcher, nullptr);
  std::atomic<int> answers{0};
  CountingFlush a(&answers), b(&answers);
  std::mt19937 rng(5);
  std::vector<std::unique_ptr<Case>> cases;
  for (int i = 0; i < 8; ++i) {
    cases.push_back(MakeCase(rng, 1, 3));
    auto request = Request(cases.back().get());
    auto done = std::move(request->done);
    request->done = [done, &answers](RequestOutcome outcome) {
      done(std::move(outcome));
      ++answers;
    };
    request->flush = i < 4 ? &a : (i < 6 ? &b : nullptr);  // Two share none.
    ASSERT_TRUE(batcher->Enqueue(std::move(request)).ok());
  }
  for (auto& c : cases) c->answered.WaitForNotification();
  for (int i = 0; i < 2000 && (a.seen().empty() || b.seen().empty()); ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  // One batch of 8: each receiver told once, after all 8 answers.
  EXPECT_EQ(a.seen(), std::vector<int>{8});
  EXPECT_EQ(b.seen(), std::vector<int>{8});
  for (auto& c : cases) EXPECT_EQ(c->outcome.batch_requests, 8);

  // A dropped request's receiver is told too, after its answer.
  auto cancelled = MakeCase(rng, 1, 3);
  auto request = Request(cancelled.get());
  request->is_cancelled = [] { return true; };
  request->flush = &a;
  ASSERT_TRUE(batcher->Enqueue(std::move(request)).ok());
  cancelled->answered.WaitForNotification();
  for (int i = 0; i < 2000 && a.seen().size() < 2; ++i) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(a.seen().size(), 2u);
  EXPECT_EQ(cancelled->outcome.status.code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace attention::server
