// DynamicBatcher with several tenants (callers' tokens), driven directly:
// the fair order of service, weights, a full queue's shares, and batches
// that mix tenants. `done` runs on the batcher's thread one request after
// another, so the order of the answers is the order of service.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/mha_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/batching/dynamic_batcher.h"
#include "server/metrics/metrics.h"
#include "tests/fixture/test_util.h"

namespace attention::server {
namespace {

using ::testing::HasSubstr;

class DynamicBatcherTenantsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = MhaModel::Random(attention::testing::SelfAttentionSpec(16, 2), 7);
    ASSERT_TRUE(model.ok());
    auto engine = MhaEngine::Create(*model);
    ASSERT_TRUE(engine.ok());
    engine_ = std::move(*engine);
    std::mt19937 rng(3);
    query_ = attention::testing::RandomTensor({1, 4, 16}, rng);
    auto solo = engine_->Forward(Inputs());
    ASSERT_TRUE(solo.ok());
    solo_ = std::move(solo->output);
  }

  std::unique_ptr<DynamicBatcher> Start(BatchingOptions options) {
    auto batcher = DynamicBatcher::Create(engine_.get(), options, metrics_.AddModel("m"),
                                          &compute_mutex_, /*compute_threads=*/1);
    EXPECT_TRUE(batcher.ok()) << batcher.status();
    return batcher.ok() ? std::move(*batcher) : nullptr;
  }

  MhaInputs Inputs() const {
    MhaInputs in;
    in.query = query_.view();
    return in;
  }

  // A request of `tenant` (weight `weight`); its answer is recorded in order.
  std::unique_ptr<PendingRequest> Request(absl::string_view tenant, int64_t weight = 1) {
    auto r = std::make_unique<PendingRequest>();
    r->inputs = Inputs();
    r->call = *engine_->Validate(r->inputs);
    r->tenant.id = tenant;
    r->tenant.name = tenant;
    r->tenant.weight = weight;
    r->done = [this, tenant = std::string(tenant)](RequestOutcome outcome) {
      absl::MutexLock lock(&mu_);
      if (outcome.status.ok()) {
        order_ += tenant;
        if (outcome.output.bytes.size() != solo_.num_elements() * sizeof(float) ||
            std::memcmp(outcome.output.bytes.data(), solo_.data(), outcome.output.bytes.size())) {
          ++mismatches_;
        }
      } else {
        refusals_.push_back(tenant + ": " + std::string(outcome.status.message()));
      }
      ++answers_;
    };
    return r;
  }

  void WaitForAnswers(int n) {
    absl::MutexLock lock(&mu_);
    const auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return answers_ >= n; };
    mu_.Await(absl::Condition(&enough));
  }

  std::unique_ptr<MhaEngine> engine_;
  Tensor query_, solo_;
  Metrics metrics_{"test"};
  absl::Mutex compute_mutex_;
  absl::Mutex mu_;
  std::string order_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> refusals_ ABSL_GUARDED_BY(mu_);
  int answers_ ABSL_GUARDED_BY(mu_) = 0;
  int mismatches_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(DynamicBatcherTenantsTest, AModestTenantIsServedNextBehindAFlood) {
  BatchingOptions options;
  options.max_batch_size = 1;
  auto batcher = Start(options);
  {
    absl::MutexLock hold(&compute_mutex_);  // Nothing computes meanwhile.
    // The batcher takes a's first request and waits to compute it, so the
    // queue is empty while a batch is in service. (CI's TSan run once took
    // it by chance, and b went third: the tags were rebased whenever the
    // queue emptied, forgiving a the batch still computing.)
    ASSERT_TRUE(batcher->Enqueue(Request("a")).ok());
    while (batcher->queue_depth() != 0) std::this_thread::yield();
    for (int i = 0; i < 19; ++i) ASSERT_TRUE(batcher->Enqueue(Request("a")).ok());
    ASSERT_TRUE(batcher->Enqueue(Request("b")).ok());
  }
  WaitForAnswers(21);
  absl::MutexLock lock(&mu_);
  // b's request goes second, right after the one the batcher held.
  EXPECT_EQ(order_.substr(0, 2), "ab") << order_;
  EXPECT_EQ(mismatches_, 0);
}

TEST_F(DynamicBatcherTenantsTest, BackloggedTenantsShareByWeight) {
  BatchingOptions options;
  options.max_batch_size = 1;
  auto batcher = Start(options);
  {
    absl::MutexLock hold(&compute_mutex_);
    for (int i = 0; i < 40; ++i) {
      ASSERT_TRUE(batcher->Enqueue(Request("a", 3)).ok());
      ASSERT_TRUE(batcher->Enqueue(Request("b", 1)).ok());
    }
  }
  WaitForAnswers(80);
  absl::MutexLock lock(&mu_);
  const std::string first = order_.substr(0, 20);
  EXPECT_NEAR(std::count(first.begin(), first.end(), 'a'), 15, 1) << order_;
}

TEST_F(DynamicBatcherTenantsTest, APushedOutRequestIsAnsweredOnceAndTheModestOneIsComputed) {
  BatchingOptions options;
  options.max_batch_size = 1;
  options.max_queue_size = 4;
  auto batcher = Start(options);
  {
    absl::MutexLock hold(&compute_mutex_);
    // The batcher takes a's first request and waits to compute it; then four
    // more fill the queue. (Filling first raced with that take: the batcher
    // could take one after the queue was full, leaving room for another.)
    ASSERT_TRUE(batcher->Enqueue(Request("a")).ok());
    while (batcher->queue_depth() != 0) std::this_thread::yield();
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(batcher->Enqueue(Request("a")).ok());
    absl::Status full = batcher->Enqueue(Request("a"));
    EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(full.message(),
              "queue is full: 4 requests waiting (max_queue_size 4: the model's config.json "
              "max_queue_size, else the server's --max_queue_size); retry later");
    ASSERT_TRUE(batcher->Enqueue(Request("b")).ok());  // Under its share of 2.
    ASSERT_TRUE(batcher->Enqueue(Request("b")).ok());
    absl::Status b_full = batcher->Enqueue(Request("b"));
    EXPECT_EQ(b_full.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(b_full.message(), HasSubstr("this caller has 2 of them, its share is 2"));
    EXPECT_EQ(batcher->queue_depth(), 4);
    const TenantSeries* a = metrics_.AddModel("m")->tenants->For("a");
    EXPECT_EQ(a->refusals[static_cast<int>(TenantRefusal::kQueueShare)]->Value(), 1);
    EXPECT_EQ(a->refusals[static_cast<int>(TenantRefusal::kPushedOut)]->Value(), 2);
    // (The pushed-out requests are answered on the batcher's thread, which
    // waits for the compute lock now: see the disabled test below.)
  }
  batcher.reset();  // Computes everything left.
  absl::MutexLock lock(&mu_);
  ASSERT_EQ(refusals_.size(), 2u);
  for (const std::string& r : refusals_) {
    EXPECT_THAT(r, HasSubstr("a: queue is full: pushed out for a caller under its share"));
  }
  EXPECT_EQ(std::count(order_.begin(), order_.end(), 'b'), 2) << order_;
  EXPECT_EQ(mismatches_, 0);
}

TEST_F(DynamicBatcherTenantsTest, BatchesMixTenantsAndEveryResultEqualsItsSoloResult) {
  BatchingOptions options;
  options.max_batch_size = 8;
  options.max_queue_delay_us = 2000;
  auto batcher = Start(options);
  // Threads of two tenants, then Stop() while they may still enqueue: the
  // run scripts/sanitize.sh repeats under ThreadSanitizer.
  std::atomic<int> accepted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        if (batcher->Enqueue(Request(t % 2 ? "a" : "b", 1 + t)).ok()) accepted.fetch_add(1);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  batcher->Stop();
  EXPECT_FALSE(batcher->Enqueue(Request("a")).ok());
  batcher.reset();
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(answers_, accepted.load());
  EXPECT_EQ(mismatches_, 0);
  EXPECT_TRUE(refusals_.empty());
}

}  // namespace
}  // namespace attention::server
