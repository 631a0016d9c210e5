#include "core/mha_engine.h"

#include "core/kv_block_pool.h"
#include "core/memory_budget.h"
#include "core/session_engine.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::testing::RandomTensor;
using ::attention::testing::StatusIs;
using ::testing::HasSubstr;

class MhaEngineValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MhaSpec spec = testing::SelfAttentionSpec(16, 2);
    spec.kdim = 12;
    spec.vdim = 10;
    model_ = *MhaModel::Random(spec, 3);
    engine_ = *MhaEngine::Create(model_);
    std::mt19937 rng(3);
    q_ = RandomTensor({2, 4, 16}, rng);
    k_ = RandomTensor({2, 5, 12}, rng);
    v_ = RandomTensor({2, 5, 10}, rng);
    in_.query = q_.view();
    in_.key = k_.view();
    in_.value = v_.view();
  }
  void ExpectInvalid(const MhaInputs& in, const std::string& message) {
    EXPECT_THAT(engine_->Forward(in),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
  }
  std::shared_ptr<const MhaModel> model_;
  std::unique_ptr<MhaEngine> engine_;
  Tensor q_, k_, v_;
  MhaInputs in_;
};

TEST_F(MhaEngineValidationTest, ValidInputsPass) { EXPECT_TRUE(engine_->Forward(in_).ok()); }

TEST_F(MhaEngineValidationTest, RejectsBadQuery) {
  MhaInputs in = in_;
  in.query.shape = {2, 4, 2, 8};
  ExpectInvalid(in, "query: expected rank 3 (N, L, E) or 2 (L, E), got shape [2, 4, 2, 8]");
  in = in_;
  in.query.shape = {4, 8, 8};
  ExpectInvalid(in, "query: expected shape [*, *, 16], got [4, 8, 8]");
  in = in_;
  in.query.dtype = DType::kBool;
  ExpectInvalid(in, "query: expected dtype float32, bfloat16 or float16, got bool");
  in = in_;
  in.query.data = nullptr;
  ExpectInvalid(in, "query: no data");
  in = in_;
  in.query.shape = {2, 0, 16};
  ExpectInvalid(in, "query: every dimension must be positive, got [2, 0, 16]");
}

TEST_F(MhaEngineValidationTest, RejectsBadKeyAndValue) {
  MhaInputs in = in_;
  in.key->shape = {2, 5, 16};
  ExpectInvalid(in, "key: expected shape [2, *, 12], got [2, 5, 16]");
  in = in_;
  in.key->shape = {3, 5, 4};  // Same element count, other batch.
  ExpectInvalid(in, "key: expected shape [2, *, 12], got [3, 5, 4]");
  in = in_;
  in.value->shape = {2, 6, 10};
  ExpectInvalid(in, "value: expected shape [2, 5, 10], got [2, 6, 10]");
  in = in_;
  in.key.reset();
  ExpectInvalid(in, "value: given without key");
  in = in_;
  in.key.reset();
  in.value.reset();
  ExpectInvalid(in, "key: required because the model's kdim 12 differs from embed_dim 16");
  in = in_;
  in.key->shape = {5, 12};
  ExpectInvalid(in, "key: expected rank 3, got shape [5, 12]");
}

TEST_F(MhaEngineValidationTest, RejectsBadMasks) {
  Tensor kpm(DType::kBool, {2, 4});
  MhaInputs in = in_;
  in.key_padding_mask = kpm.view();
  ExpectInvalid(in, "key_padding_mask: expected shape [2, 5], got [2, 4]");
  Tensor am(DType::kFloat32, {1, 5});
  in = in_;
  in.attn_mask = am.view();
  ExpectInvalid(in, "attn_mask: expected shape [4, 5] or [4, 4, 5], got [1, 5]");
  Tensor am3(DType::kBool, {2, 4, 5});
  in.attn_mask = am3.view();
  ExpectInvalid(in, "attn_mask: expected shape [4, 4, 5], got [2, 4, 5]");
  in = in_;
  in.output_dtype = DType::kBool;
  ExpectInvalid(in, "output_dtype");
}

// Every engine entry checks the widths it reads itself: a caller's mistake
// (the server once sent E-wide tokens to the kdim-wide key projection of a
// self session) is INVALID_ARGUMENT, never a write past a workspace.
TEST_F(MhaEngineValidationTest, ProjectChecksItsInputWidth) {
  std::vector<float> y(64 * 16, 0.0f);
  Tensor tokens(DType::kFloat32, {5, 16});  // E wide, not kdim wide.
  EXPECT_THAT(
      engine_->Project(MhaEngine::Part::kKey, tokens.view(), y.data()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected input of shape [*, 12]")));
  EXPECT_THAT(engine_->Project(MhaEngine::Part::kValue, tokens.view(), y.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[*, 10], got [5, 16]")));
  Tensor flat(DType::kFloat32, {60});
  EXPECT_THAT(engine_->Project(MhaEngine::Part::kQuery, flat.view(), y.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("")));
  EXPECT_TRUE(engine_
                  ->Project(MhaEngine::Part::kKey, TensorView{DType::kFloat32, {10, 12}, k_.data()},
                            y.data())
                  .ok());
}

TEST_F(MhaEngineValidationTest, ForwardBatchChecksShapes) {
  std::vector<float> out(2 * 4 * 16);
  std::vector<ItemMask> items(2);
  EXPECT_THAT(
      engine_->ForwardBatch(q_.view(), std::nullopt, std::nullopt, items, out.data(), nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kdim 12 and vdim 10")));
  EXPECT_THAT(
      engine_->ForwardBatch(q_.view(), v_.view(), v_.view(), items, out.data(), nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key: expected shape [2, *, 12]")));
  std::vector<ItemMask> one(1);
  EXPECT_THAT(engine_->ForwardBatch(q_.view(), k_.view(), v_.view(), one, out.data(), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("items")));
}

// PyTorch refuses self-attention when kdim or vdim differs from embed_dim;
// so does a self session (it once projected E-wide tokens with the kdim-wide
// key weights and overflowed the workspace: issue 21, item 1).
TEST_F(MhaEngineValidationTest, SelfSessionsNeedKdimAndVdimEqualToEmbedDim) {
  SessionEngine sessions(engine_.get(), DType::kFloat32);
  EXPECT_THAT(sessions.SupportsSelf(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kdim 12 and vdim 10")));
  Tensor tokens(DType::kFloat32, {5, 16});
  EXPECT_THAT(sessions.ValidateStep(false, tokens.view(), std::nullopt),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("")));
  EXPECT_TRUE(sessions.ValidateStep(true, tokens.view(), std::nullopt).ok());
  // Run refuses a self step too, before touching the cache.
  MemoryBudget budget(size_t{4} << 20);
  KvBlockPool pool(sessions.block_bytes(), &budget);
  KvCache cache(&pool, 2, 8, DType::kFloat32);
  ASSERT_TRUE(cache.Reserve(5).ok());
  std::vector<float> out(5 * 16);
  SessionStep step;
  step.cache = &cache;
  step.tokens = tokens.view();
  step.output = out.data();
  EXPECT_THAT(sessions.Run({step}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("")));
  EXPECT_EQ(cache.length(), 0);
  // kdim == vdim > embed_dim: also refused (it once gave answers that
  // depended on what an earlier request left in the workspace).
  MhaSpec wide = testing::SelfAttentionSpec(16, 2);
  wide.kdim = wide.vdim = 32;
  auto engine = *MhaEngine::Create(*MhaModel::Random(wide, 4));
  EXPECT_FALSE(SessionEngine(engine.get(), DType::kFloat32).SupportsSelf().ok());
}

}  // namespace
}  // namespace attention
