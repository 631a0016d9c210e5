#include "server/requests/tenant_rates.h"

#include <string>

#include "core/retry_after.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attention::server {
namespace {

using ::testing::HasSubstr;

class TenantRatesTest : public ::testing::Test {
 protected:
  absl::Time now_ = absl::FromUnixSeconds(1000);
  TenantRates rates_{[this] { return now_; }};
};

TEST_F(TenantRatesTest, ACallerWithoutLimitsIsNeverRefused) {
  Principal p;
  p.id = "a";
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(rates_.Take(p, 1 << 20).ok());
}

TEST_F(TenantRatesTest, RequestsPerSecondWithABurstOfOneSecond) {
  Principal p;
  p.id = "a";
  p.name = "alice";
  p.rate = 2;
  EXPECT_TRUE(rates_.Take(p, 1).ok());
  EXPECT_TRUE(rates_.Take(p, 1).ok());
  absl::Status third = rates_.Take(p, 1);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.message(), HasSubstr("rate: caller 'alice' is over its rate of 2 requests/s"));
  EXPECT_THAT(third.message(), HasSubstr("retry after 500 ms"));
  ASSERT_TRUE(RetryAfterOf(third).has_value());
  EXPECT_EQ(*RetryAfterOf(third), absl::Milliseconds(500));
  // A refusal costs nothing: half a second later one more passes.
  now_ += absl::Milliseconds(500);
  EXPECT_TRUE(rates_.Take(p, 1).ok());
  EXPECT_FALSE(rates_.Take(p, 1).ok());
  // Another caller has its own bucket.
  Principal q = p;
  q.id = "b";
  EXPECT_TRUE(rates_.Take(q, 1).ok());
}

TEST_F(TenantRatesTest, TokensPerSecondLetALargeRequestPassThenWait) {
  Principal p;
  p.id = "a";
  p.name = "alice";
  p.token_rate = 100;
  EXPECT_TRUE(rates_.Take(p, 250).ok());  // Larger than a second's budget: in debt.
  absl::Status next = rates_.Take(p, 1);
  EXPECT_EQ(next.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(next.message(), HasSubstr("100 query tokens/s"));
  ASSERT_TRUE(RetryAfterOf(next).has_value());
  EXPECT_EQ(*RetryAfterOf(next), absl::Milliseconds(1510));  // (150 + 1) / 100 s.
  now_ += absl::Milliseconds(1510);
  EXPECT_TRUE(rates_.Take(p, 1).ok());
}

// Over both limits: the hint is the longer wait, so that a retry after it
// passes (a hint from the request rate alone would be refused again).
TEST_F(TenantRatesTest, TheHintWaitsForBothLimits) {
  Principal p;
  p.id = "a";
  p.name = "alice";
  p.rate = 1;
  p.token_rate = 10;
  EXPECT_TRUE(rates_.Take(p, 100).ok());  // 90 tokens in debt, no request left.
  absl::Status next = rates_.Take(p, 1);
  EXPECT_EQ(next.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(next.message(), HasSubstr("10 query tokens/s"));
  ASSERT_TRUE(RetryAfterOf(next).has_value());
  EXPECT_EQ(*RetryAfterOf(next), absl::Milliseconds(9100));  // (90 + 1) / 10 s.
  now_ += *RetryAfterOf(next);
  EXPECT_TRUE(rates_.Take(p, 1).ok());
}

// A bucket in debt is kept until the debt is repaid, however long the caller
// stays away: forgetting it would start the caller again with a full bucket.
TEST_F(TenantRatesTest, ADebtOutlastsTheIdleForgetting) {
  Principal p;
  p.id = "a";
  p.name = "alice";
  p.token_rate = 10;
  EXPECT_TRUE(rates_.Take(p, 1000).ok());  // 990 tokens in debt: 99 s.
  now_ += absl::Seconds(61);
  Principal q = p;
  q.id = "b";
  EXPECT_TRUE(rates_.Take(q, 1).ok());  // Prunes the idle buckets.
  absl::Status again = rates_.Take(p, 1);
  EXPECT_EQ(again.code(), absl::StatusCode::kResourceExhausted) << again;
  now_ += absl::Seconds(39);
  EXPECT_TRUE(rates_.Take(p, 1).ok());
}

}  // namespace
}  // namespace attention::server
