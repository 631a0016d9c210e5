#include "server/memory_plan.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/batching/dynamic_batcher.h"
#include "server/batching/model_bytes.h"
#include "tests/fixture/test_util.h"

namespace attention::server {
namespace {

using ::attention::testing::StatusIs;
using ::testing::_;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

MemoryPlanInputs Inputs(int64_t limit, int64_t baseline = 80 * kMiB) {
  MemoryPlanInputs in;
  in.limit_bytes = limit;
  in.limit_source = "test limit";
  in.baseline_bytes = baseline;
  in.baseline_source = "test baseline";
  in.max_message_bytes = 64 * kMiB;
  return in;
}

// Everything the plan sums, computed here from the accessors.
int64_t Sum(const MemoryPlan& plan) {
  return plan.baseline_bytes() + plan.max_inflight_bytes() + plan.grpc_receive_quota_bytes() +
         plan.session_memory_bytes() + plan.workspace_kept_bytes() +
         plan.allocator_reserve_bytes() + plan.max_batch_weights_bytes();
}

TEST(MemoryPlanTest, DefaultsStayUnderTheTargetShareOfEveryLimit) {
  for (int64_t limit : {kGiB / 2, kGiB, 2 * kGiB, 3 * kGiB, 23 * kGiB, 256 * kGiB}) {
    SCOPED_TRACE(limit);
    auto plan = MemoryPlan::Make(Inputs(limit));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->total_bytes(), Sum(*plan));
    // A largest message is 64 MiB: under 1 GiB its quota floor can push the
    // sum past 85% (with a warning); otherwise it stays within.
    if (limit >= kGiB) {
      EXPECT_LE(Sum(*plan), static_cast<int64_t>(MemoryPlan::kTargetShare * limit));
      EXPECT_THAT(plan->warnings(), ::testing::IsEmpty());
    }
    EXPECT_LE(Sum(*plan), limit);
    EXPECT_GT(plan->max_inflight_bytes(), 0);
    EXPECT_GT(plan->session_memory_bytes(), 0);
    EXPECT_GT(plan->workspace_kept_bytes(), 0);
    EXPECT_GE(plan->grpc_receive_quota_bytes(), 64 * kMiB);
    // The computing batch's cap: half the in-flight budget at most, beside it.
    EXPECT_LE(plan->max_batch_weights_bytes(), plan->max_inflight_bytes());
    EXPECT_LE(plan->max_batch_weights_bytes(), DynamicBatcher::kMaxBatchWeightsBytes);
    EXPECT_GT(plan->max_batch_weights_bytes(), 0);
  }
}

// The budgets that got the container OOM-killed (issue 21, 3b): a quarter of
// 1 GiB in flight, twice that as gRPC's quota, a quarter for sessions, and
// the 512 MiB weights cap summed to 1.5 GiB before the process itself.
TEST(MemoryPlanTest, OneGibibyteLeavesAMarginForWhatNoBudgetCounts) {
  auto plan = MemoryPlan::Make(Inputs(kGiB, 70 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_LE(Sum(*plan), static_cast<int64_t>(0.85 * kGiB));
  EXPECT_LT(
      plan->max_inflight_bytes() + plan->grpc_receive_quota_bytes() + plan->session_memory_bytes(),
      kGiB / 2 + kGiB / 4);
  EXPECT_LE(plan->max_batch_weights_bytes(), plan->max_inflight_bytes() / 2);
}

TEST(MemoryPlanTest, ExplicitFlagsAreKeptAndTheOthersShrinkToFit) {
  MemoryPlanInputs in = Inputs(kGiB);
  in.max_inflight_bytes = 300 * kMiB;  // And 150 MiB for its computing batch.
  in.session_memory_bytes = 250 * kMiB;
  auto plan = MemoryPlan::Make(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->max_inflight_bytes(), 300 * kMiB);
  EXPECT_EQ(plan->session_memory_bytes(), 250 * kMiB);
  // 80 + 300 + 150 + 250 leaves 90 MiB of 85%: the derived budgets share
  // it, and the quota keeps one largest message (64 MiB).
  EXPECT_LE(plan->workspace_kept_bytes() + plan->allocator_reserve_bytes(), 90 * kMiB);
  EXPECT_EQ(plan->grpc_receive_quota_bytes(), 64 * kMiB);
  EXPECT_LE(Sum(*plan), kGiB);
  EXPECT_THAT(plan->Table(), HasSubstr("scaled to"));
  EXPECT_THAT(plan->Table(), HasSubstr("--max_inflight_bytes"));
}

// gRPC's quota follows an explicit in-flight budget (twice it, at least two
// largest messages), as it did before the plan: a small budget is not
// undone by a quota sized for the whole machine.
TEST(MemoryPlanTest, TheReceiveQuotaIsAtMostTwiceTheInflightBudget) {
  MemoryPlanInputs in = Inputs(24 * kGiB);
  in.max_inflight_bytes = 32 * kMiB;
  in.max_message_bytes = 8 * kMiB;
  auto plan = MemoryPlan::Make(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->grpc_receive_quota_bytes(), 64 * kMiB);
  in.max_message_bytes = 64 * kMiB;
  EXPECT_EQ(MemoryPlan::Make(in)->grpc_receive_quota_bytes(), 128 * kMiB);
  // Given explicitly, it is taken as is.
  in.grpc_receive_quota_bytes = 512 * kMiB;
  EXPECT_EQ(MemoryPlan::Make(in)->grpc_receive_quota_bytes(), 512 * kMiB);
}

TEST(MemoryPlanTest, RefusesExplicitFlagsOverTheLimitNamingThem) {
  MemoryPlanInputs in = Inputs(kGiB);
  in.max_inflight_bytes = 768 * kMiB;
  in.session_memory_bytes = 256 * kMiB;
  auto plan = MemoryPlan::Make(in);
  EXPECT_THAT(plan, StatusIs(absl::StatusCode::kFailedPrecondition,
                             HasSubstr("--max_inflight_bytes=805306368")));
  EXPECT_THAT(plan.status().message(), HasSubstr("--session_memory_bytes=268435456"));
  EXPECT_THAT(plan.status().message(), HasSubstr("1073741824"));
  EXPECT_THAT(plan.status().message(), HasSubstr("test limit"));
  // One flag alone at the limit fails too: the baseline is counted.
  in.session_memory_bytes = 0;
  in.max_inflight_bytes = kGiB;
  EXPECT_THAT(MemoryPlan::Make(in).status(), StatusIs(absl::StatusCode::kFailedPrecondition, _));
  // Just inside (with its computing batch's half on top): starts, with a
  // warning that the target is exceeded.
  in.max_inflight_bytes = (kGiB - 80 * kMiB - 64 * kMiB) / 3 * 2;
  auto tight = MemoryPlan::Make(in);
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_THAT(tight->Table(), HasSubstr("warning"));
}

TEST(MemoryPlanTest, RefusesABaselineOverTheLimit) {
  auto plan = MemoryPlan::Make(Inputs(kGiB, kGiB + 1));
  EXPECT_THAT(plan, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("baseline alone")));
}

TEST(MemoryPlanTest, RefusesNonsense) {
  EXPECT_THAT(MemoryPlan::Make(Inputs(0)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  MemoryPlanInputs in = Inputs(kGiB);
  in.max_inflight_bytes = -1;
  EXPECT_THAT(MemoryPlan::Make(in).status(), StatusIs(absl::StatusCode::kInvalidArgument, _));
}

TEST(MemoryPlanTest, TableHasOneLinePerBudgetWithBytesAndSource) {
  auto plan = MemoryPlan::Make(Inputs(kGiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string table = plan->Table();
  for (const char* name :
       {"baseline", "max_inflight_bytes", "grpc_receive_quota_bytes", "session_memory_bytes",
        "workspaces_kept", "allocator_reserve", "max_batch_working_bytes", "total"}) {
    EXPECT_THAT(table, HasSubstr(name));
  }
  EXPECT_THAT(table, HasSubstr(std::to_string(plan->max_inflight_bytes()) + " bytes"));
  EXPECT_THAT(table, HasSubstr("test limit"));
  EXPECT_THAT(table, HasSubstr("test baseline"));
  EXPECT_EQ(plan->lines().size(), 7u);
}

TEST(MemoryPlanTest, BaselineCountsTheResidentSetModelsAndRuntime) {
  std::string source;
  const int64_t demo = MemoryPlan::EstimateBaseline(30 * kMiB, "", &source);
  EXPECT_GT(demo, 30 * kMiB + MemoryPlan::kRuntimeBytes);
  EXPECT_LT(demo, 30 * kMiB + MemoryPlan::kRuntimeBytes + 8 * kMiB);
  EXPECT_THAT(source, HasSubstr("of models' weights"));
  // A folder without models adds nothing for them.
  EXPECT_EQ(MemoryPlan::EstimateBaseline(30 * kMiB, "/nonexistent-model-repository", nullptr),
            30 * kMiB + MemoryPlan::kRuntimeBytes);
  // A model folder whose spec cannot be read counts its file bytes (once
  // resident, once for its load); other files count nothing.
  const std::filesystem::path repo =
      std::filesystem::path(::testing::TempDir()) / "memory_plan_test_repo";
  std::filesystem::remove_all(repo);
  std::filesystem::create_directories(repo / "m");
  std::ofstream(repo / "m" / "model.safetensors") << std::string(1000, 'x');
  std::ofstream(repo / "m" / "config.json") << std::string(500, ' ');
  EXPECT_EQ(MemoryPlan::EstimateBaseline(30 * kMiB, repo.string(), nullptr),
            30 * kMiB + 2 * 1000 + MemoryPlan::kRuntimeBytes);
  // Real models count the engine's resident estimate (float32: the packed
  // weights, the file's size give or take the biases; bfloat16 half), plus
  // the largest file once.
  std::filesystem::remove_all(repo);
  MhaSpec spec = ::attention::testing::SelfAttentionSpec(256, 8);
  ::attention::testing::WriteModelDir(**MhaModel::Random(spec, 1), (repo / "f32").string());
  const int64_t f32 = *MhaEngine::EstimateResidentBytes(spec, ServingEngineOptions());
  spec.compute_dtype = DType::kBFloat16;
  ::attention::testing::WriteModelDir(**MhaModel::Random(spec, 2), (repo / "bf16").string());
  const int64_t bf16 = *MhaEngine::EstimateResidentBytes(spec, ServingEngineOptions());
  const int64_t file = std::filesystem::file_size(repo / "f32" / "model.safetensors");
  EXPECT_NEAR(static_cast<double>(f32) / file, 1.0, 0.02);
  EXPECT_NEAR(static_cast<double>(bf16) / file, 0.5, 0.02);
  EXPECT_EQ(MemoryPlan::EstimateBaseline(30 * kMiB, repo.string(), nullptr),
            30 * kMiB + f32 + bf16 + file + MemoryPlan::kRuntimeBytes);
  std::filesystem::remove_all(repo);
}

}  // namespace
}  // namespace attention::server
