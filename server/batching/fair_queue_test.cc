// FairQueue alone: no engine, no batcher. Requests carry only their tenant
// and a sequence number (in call.batch); costs are given explicitly.
#include "server/batching/fair_queue.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace attention::server {
namespace {

std::unique_ptr<PendingRequest> Request(absl::string_view tenant, int64_t weight, int64_t n) {
  auto r = std::make_unique<PendingRequest>();
  r->tenant.id = tenant;
  r->tenant.name = tenant;
  r->tenant.weight = weight;
  r->call.batch = n;  // The request's number, to tell them apart.
  return r;
}

class FairQueueTest : public ::testing::Test {
 protected:
  // Pushes one request; returns the push's status.
  absl::Status Push(FairQueue& q, absl::string_view tenant, double cost, int64_t weight = 1,
                    FairQueue::Evicted* evicted = nullptr) {
    FairQueue::Evicted ignored;
    auto r = Request(tenant, weight, next_++);
    return q.Push(r, cost, evicted != nullptr ? evicted : &ignored);
  }
  // Takes the head alone; returns its tenant.
  static std::string TakeHead(FairQueue& q) {
    std::vector<FairQueue::Position> head;
    q.Visit([&](const PendingRequest&, FairQueue::Position p) {
      head.push_back(p);
      return false;
    });
    auto taken = q.Take(head);
    return std::string(taken.at(0)->tenant.id);
  }
  int64_t next_ = 0;
};

TEST_F(FairQueueTest, SharesFollowTheWeights) {
  FairQueue q(100000, nullptr);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(Push(q, "a", 1, 3).ok());
    ASSERT_TRUE(Push(q, "b", 1, 1).ok());
  }
  std::map<std::string, int> served;
  for (int i = 0; i < 400; ++i) ++served[TakeHead(q)];
  EXPECT_NEAR(served["a"], 300, 1);
  EXPECT_NEAR(served["b"], 100, 1);
}

TEST_F(FairQueueTest, SharesAreCountedInWorkNotRequests) {
  FairQueue q(100000, nullptr);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(Push(q, "big", 4).ok());
    ASSERT_TRUE(Push(q, "small", 1).ok());
  }
  std::map<std::string, int> served;
  for (int i = 0; i < 500; ++i) ++served[TakeHead(q)];
  // Equal work: the small requests go four times as often.
  EXPECT_NEAR(served["small"], 400, 1);
  EXPECT_NEAR(served["big"], 100, 1);
}

TEST_F(FairQueueTest, AnIdleTenantIsServedNext) {
  FairQueue q(100000, nullptr);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(Push(q, "a", 10).ok());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(TakeHead(q), "a");
  ASSERT_TRUE(Push(q, "b", 10).ok());
  EXPECT_EQ(q.Head().tenant.id, "b");
  EXPECT_EQ(TakeHead(q), "b");
  // And again after its debt lapsed.
  for (int i = 0; i < 20; ++i) EXPECT_EQ(TakeHead(q), "a");
  ASSERT_TRUE(Push(q, "b", 10).ok());
  EXPECT_EQ(TakeHead(q), "b");
}

TEST_F(FairQueueTest, AnExpensiveRequestIsNotStarved) {
  FairQueue q(100000, nullptr);
  ASSERT_TRUE(Push(q, "a", 1).ok());
  ASSERT_TRUE(Push(q, "b", 1000).ok());
  int taken = 0;
  // a keeps its queue full: b's turn still comes within 1001 takes.
  for (; taken < 2000; ++taken) {
    ASSERT_TRUE(Push(q, "a", 1).ok());
    if (TakeHead(q) == "b") break;
  }
  EXPECT_LE(taken, 1001);
}

TEST_F(FairQueueTest, ARequestSkippedByABatchKeepsItsPlace) {
  FairQueue q(100, nullptr);
  ASSERT_TRUE(Push(q, "a", 1).ok());  // #0
  ASSERT_TRUE(Push(q, "b", 1).ok());  // #1
  ASSERT_TRUE(Push(q, "a", 1).ok());  // #2
  // A batch takes #0 and #2 (say #1 could not join them).
  std::vector<FairQueue::Position> picked;
  q.Visit([&](const PendingRequest& r, FairQueue::Position p) {
    if (r.call.batch != 1) picked.push_back(p);
    return true;
  });
  auto batch = q.Take(picked);
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0]->call.batch, 0);
  EXPECT_EQ(batch[1]->call.batch, 2);
  ASSERT_TRUE(Push(q, "a", 1).ok());
  EXPECT_EQ(q.Head().call.batch, 1);
}

TEST_F(FairQueueTest, TheOrderIsDeterministic) {
  auto run = [this] {
    FairQueue q(100000, nullptr);
    std::vector<int64_t> order;
    const char* tenants[] = {"a", "b", "c"};
    for (int i = 0; i < 300; ++i) {
      const double cost = 1 + (i * 7919) % 13;
      EXPECT_TRUE(Push(q, tenants[i % 3], cost, 1 + i % 3).ok());
      if (i % 2 == 1) {
        std::vector<FairQueue::Position> head;
        q.Visit([&](const PendingRequest& r, FairQueue::Position p) {
          head.push_back(p);
          order.push_back(r.call.batch);
          return false;
        });
        q.Take(head);
      }
    }
    q.Visit([&](const PendingRequest& r, FairQueue::Position) {
      order.push_back(r.call.batch);
      return true;
    });
    return order;
  };
  next_ = 0;
  const std::vector<int64_t> first = run();
  next_ = 0;
  EXPECT_EQ(run(), first);
  EXPECT_EQ(first.size(), 300u);
}

TEST_F(FairQueueTest, OneTenantIsAFifoWithTheOldMessage) {
  FairQueue q(3, nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Push(q, "", 1 + i * 100).ok());
  FairQueue::Evicted evicted;
  auto r = Request("", 1, 99);
  absl::Status full = q.Push(r, 1, &evicted);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(full.message(),
            "queue is full: 3 requests waiting (max_queue_size 3: the model's config.json "
            "max_queue_size, else the server's --max_queue_size); retry later");
  ASSERT_NE(r, nullptr);  // Refused: still the caller's.
  EXPECT_EQ(evicted.request, nullptr);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(q.Head().call.batch, i);
    TakeHead(q);
  }
  EXPECT_TRUE(q.empty());
  EXPECT_GT(q.virtual_time(), 0);  // Until the batcher says it is idle.
  q.Idle();
  EXPECT_EQ(q.virtual_time(), 0);
}

TEST_F(FairQueueTest, ATenantArrivingWhileTheLastBatchComputesGoesFirst) {
  FairQueue q(100, nullptr);
  ASSERT_TRUE(Push(q, "a", 10).ok());
  EXPECT_EQ(TakeHead(q), "a");  // Taken: the queue is empty, a's batch computes.
  ASSERT_TRUE(Push(q, "a", 10).ok());
  ASSERT_TRUE(Push(q, "b", 10).ok());
  // a's second request starts after its first finishes; b owes nothing.
  EXPECT_EQ(TakeHead(q), "b");
  EXPECT_EQ(TakeHead(q), "a");
  // Once the batcher is idle, debts are forgiven: arrival order again.
  q.Idle();
  ASSERT_TRUE(Push(q, "a", 10).ok());
  ASSERT_TRUE(Push(q, "b", 10).ok());
  q.Idle();  // Not idle while anything is queued: a no-op.
  EXPECT_EQ(TakeHead(q), "a");
  EXPECT_EQ(TakeHead(q), "b");
}

TEST_F(FairQueueTest, AFullQueueRefusesTheTenantAtItsShareAndPushesOutForOneUnder) {
  FairQueue q(10, nullptr);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(Push(q, "a", 1).ok());
  absl::Status a11 = Push(q, "a", 1);
  EXPECT_EQ(a11.code(), absl::StatusCode::kResourceExhausted);
  // b, under its share (5 of 10), pushes out a's newest request.
  for (int i = 0; i < 5; ++i) {
    FairQueue::Evicted evicted;
    ASSERT_TRUE(Push(q, "b", 1, 1, &evicted).ok()) << i;
    ASSERT_NE(evicted.request, nullptr) << i;
    EXPECT_EQ(evicted.request->tenant.id, "a");
    EXPECT_EQ(evicted.request->call.batch, 9 - i);  // The newest first.
    EXPECT_EQ(evicted.why.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(evicted.why.message().find("pushed out"), absl::string_view::npos) << evicted.why;
  }
  EXPECT_EQ(q.depth("a"), 5);
  EXPECT_EQ(q.depth("b"), 5);
  EXPECT_EQ(q.size(), 10);
  // Now both hold their shares.
  absl::Status b6 = Push(q, "b", 1);
  EXPECT_EQ(b6.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b6.message().find("its share is 5 (weight 1 of 2"), absl::string_view::npos) << b6;
  EXPECT_EQ(Push(q, "a", 1).code(), absl::StatusCode::kResourceExhausted);
  // Pushed-out requests cost their tenant nothing: a and b alternate.
  std::string order;
  for (int i = 0; i < 10; ++i) order += TakeHead(q);
  EXPECT_EQ(order, "ababababab");
}

TEST_F(FairQueueTest, SharesOfAFullQueueFollowTheWeights) {
  FairQueue q(8, nullptr);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(Push(q, "b", 1, 1).ok());
  // a, weight 3, has a share of 6 of the 8.
  for (int i = 0; i < 6; ++i) {
    FairQueue::Evicted evicted;
    ASSERT_TRUE(Push(q, "a", 1, 3, &evicted).ok()) << i;
    EXPECT_NE(evicted.request, nullptr);
  }
  EXPECT_EQ(Push(q, "a", 1, 3).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(q.depth("a"), 6);
  EXPECT_EQ(q.depth("b"), 2);
}

TEST_F(FairQueueTest, RemoveIfAndTheTimesSpanEveryTenant) {
  FairQueue q(100, nullptr);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 6; ++i) {
    auto r = Request(i % 2 ? "b" : "a", 1, i);
    r->enqueued = t0 + absl::Seconds(i);
    r->deadline = t0 + absl::Seconds(100 - i);
    FairQueue::Evicted evicted;
    ASSERT_TRUE(q.Push(r, 1, &evicted).ok());
  }
  EXPECT_EQ(q.OldestEnqueued(), t0);
  EXPECT_EQ(q.EarliestDeadline(), t0 + absl::Seconds(95));
  std::vector<std::pair<std::unique_ptr<PendingRequest>, absl::Status>> removed;
  q.RemoveIf(
      [](const PendingRequest& r) {
        return r.call.batch % 3 == 0 ? absl::CancelledError("gone") : absl::OkStatus();
      },
      &removed);
  ASSERT_EQ(removed.size(), 2u);  // #0 and #3.
  EXPECT_EQ(q.size(), 4);
  EXPECT_EQ(q.OldestEnqueued(), t0 + absl::Seconds(1));
  std::vector<int64_t> order;
  q.Visit([&](const PendingRequest& r, FairQueue::Position) {
    order.push_back(r.call.batch);
    return true;
  });
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 4, 5}));
}

// Requests dropped while queued (deadline, cancellation) were never
// computed: like a pushed-out one, they cost their tenant nothing, so its
// next request is served as if they had not been sent.
TEST_F(FairQueueTest, DroppedRequestsCostTheirTenantNothing) {
  FairQueue q(10000, nullptr);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(Push(q, "a", 1).ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(Push(q, "b", 100).ok());
  for (int i = 0; i < 5; ++i) TakeHead(q);  // a's first four and b's first.
  std::vector<std::pair<std::unique_ptr<PendingRequest>, absl::Status>> removed;
  q.RemoveIf(
      [](const PendingRequest& r) {
        return r.tenant.id == "b" ? absl::CancelledError("gone") : absl::OkStatus();
      },
      &removed);
  ASSERT_EQ(removed.size(), 9u);
  ASSERT_TRUE(Push(q, "b", 1).ok());
  // b owes the one request computed (cost 100), not the 900 dropped: its
  // next one goes after a's requests up to virtual time 100, not 1000.
  int taken = 0;
  while (TakeHead(q) != "b") ASSERT_LT(++taken, 150);
}

TEST_F(FairQueueTest, DroppingATenantsNewestRequestsGivesBackTheirTags) {
  FairQueue q(10000, nullptr);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(Push(q, "a", 1).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Push(q, "c", 50).ok());  // #1000 to #1002.
  std::vector<std::pair<std::unique_ptr<PendingRequest>, absl::Status>> removed;
  q.RemoveIf(
      [](const PendingRequest& r) {
        return r.call.batch > 1000 ? absl::CancelledError("gone") : absl::OkStatus();
      },
      &removed);
  ASSERT_EQ(removed.size(), 2u);
  ASSERT_TRUE(Push(q, "c", 50).ok());  // #1003
  // c's new request starts where its queued one finishes (50), not after
  // the two dropped (150): a0, c's #1000, a1 to a50, then it.
  int position = 0, found = -1;
  q.Visit([&](const PendingRequest& r, FairQueue::Position) {
    if (r.call.batch == 1003) found = position;
    ++position;
    return found < 0;
  });
  EXPECT_EQ(found, 52);
}

TEST_F(FairQueueTest, TenantSeriesFollowTheQueue) {
  prometheus::Registry registry;
  TenantFamilies families(registry, {0.001, 0.01, 0.1, 1});
  TenantMetrics metrics(&families, "m");
  FairQueue q(2, &metrics);
  ASSERT_TRUE(Push(q, "a", 1).ok());
  ASSERT_TRUE(Push(q, "a", 1).ok());
  EXPECT_EQ(Push(q, "a", 1).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(Push(q, "b", 1).ok());  // Pushes one of a's out.
  const TenantSeries* a = metrics.For("a");
  const TenantSeries* b = metrics.For("b");
  EXPECT_EQ(a->queue_depth->Value(), 1);
  EXPECT_EQ(b->queue_depth->Value(), 1);
  EXPECT_EQ(a->refusals[static_cast<int>(TenantRefusal::kQueueShare)]->Value(), 1);
  EXPECT_EQ(a->refusals[static_cast<int>(TenantRefusal::kPushedOut)]->Value(), 1);
  EXPECT_EQ(q.Head().tenant_series, a);
  TakeHead(q);
  TakeHead(q);
  EXPECT_EQ(a->queue_depth->Value(), 0);
  EXPECT_EQ(b->queue_depth->Value(), 0);
}

}  // namespace
}  // namespace attention::server
