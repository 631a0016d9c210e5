#include "core/bound_call.h"

#include <random>
#include <vector>

#include "core/mha_engine.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::testing::MaxExcess;
using ::attention::testing::RandomTensor;
using ::attention::testing::ReferenceMha;
using ::attention::testing::StatusIs;
using ::testing::HasSubstr;
using dt = dnnl::memory::data_type;

dnnl::memory::desc Md(int64_t rows, int64_t cols) {
  return dnnl::memory::desc({rows, cols}, dt::f32, dnnl::memory::format_tag::ab);
}

// y (m x 4) = x (m x 4) w (4 x 4).
std::shared_ptr<const CachedPrimitive> Matmul(PrimitiveCache& cache, const std::string& key,
                                              int64_t m) {
  auto p = cache.GetOrCreate<dnnl::matmul, dnnl::matmul::primitive_desc>(key, [m] {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(Md(m, 4), Md(4, 4), Md(m, 4)), attr,
                                        CpuEngine());
  });
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : nullptr;
}

BoundCallKey Key(int64_t k) { return BoundCallKey{k, 1, 2, 3}; }

BoundCall* Bind(const BoundCallKey& key, std::shared_ptr<const CachedPrimitive> prim, int64_t m) {
  return BoundCall::Insert(
      key, std::move(prim),
      {{DNNL_ARG_SRC, Md(m, 4)}, {DNNL_ARG_WEIGHTS, Md(4, 4)}, {DNNL_ARG_DST, Md(m, 4)}});
}

// x w with w = diag(scale) is x * scale.
void RunScaled(BoundCall* call, const std::vector<float>& x, float scale, std::vector<float>* y) {
  std::vector<float> w(16, 0.0f);
  for (int i = 0; i < 4; ++i) w[i * 4 + i] = scale;
  y->assign(x.size(), -1.0f);
  call->Set(DNNL_ARG_SRC, x.data());
  call->Set(DNNL_ARG_WEIGHTS, w.data());
  call->Set(DNNL_ARG_DST, y->data());
  ASSERT_TRUE(call->Execute().ok());
}

TEST(BoundCallTest, FoundAgainAndRunsOnNewDataPointers) {
  PrimitiveCache cache(4);
  BoundCall* call = Bind(Key(1), Matmul(cache, "m2", 2), 2);
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8}, y;
  RunScaled(call, x, 2.0f, &y);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], 2.0f * x[i]);

  // The same entry, now over other buffers (new weights, input and output).
  BoundCall* again = BoundCall::Find(Key(1));
  ASSERT_EQ(again, call);
  std::vector<float> x2 = {-1, 0, 1, 2, 3, 4, 5, 6};
  std::vector<float> y2;
  RunScaled(again, x2, 3.0f, &y2);
  for (size_t i = 0; i < x2.size(); ++i) EXPECT_EQ(y2[i], 3.0f * x2[i]);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], 2.0f * x[i]) << "old output rewritten";
  EXPECT_EQ(BoundCall::Find(Key(2)), nullptr);
}

TEST(BoundCallTest, MissesOnceItsPrimitiveLeavesTheCache) {
  const int live_before = BoundCall::LiveEntries();
  {
    PrimitiveCache cache(1);
    BoundCall* call = Bind(Key(10), Matmul(cache, "a", 2), 2);
    std::vector<float> x(8, 1.0f), y;
    RunScaled(call, x, 1.0f, &y);
    EXPECT_EQ(BoundCall::LiveEntries(), live_before + 1);
    ASSERT_NE(Matmul(cache, "b", 3), nullptr);  // Evicts "a".
    EXPECT_EQ(BoundCall::Find(Key(10)), nullptr);
    EXPECT_EQ(BoundCall::LiveEntries(), live_before);
    call = Bind(Key(11), Matmul(cache, "b", 3), 3);
    RunScaled(call, std::vector<float>(12, 1.0f), 1.0f, &y);
  }
  // The cache (and with it every primitive) is gone.
  EXPECT_EQ(BoundCall::Find(Key(11)), nullptr);
  EXPECT_EQ(BoundCall::LiveEntries(), live_before);
}

TEST(BoundCallTest, KeepsTheMostRecentlyUsedEntries) {
  PrimitiveCache cache(64);
  auto prim = Matmul(cache, "m1", 1);
  std::vector<float> x(4, 1.0f), y;
  for (int64_t k = 0; k < BoundCall::kEntries; ++k)
    RunScaled(Bind(Key(100 + k), prim, 1), x, 1, &y);
  // Use the first again, then add one more: the second is replaced.
  BoundCall* first = BoundCall::Find(Key(100));
  ASSERT_NE(first, nullptr);
  RunScaled(first, x, 1.0f, &y);
  RunScaled(Bind(Key(200), prim, 1), x, 1.0f, &y);
  EXPECT_EQ(BoundCall::Find(Key(101)), nullptr);
  for (int64_t k : {100, 102, 200}) {
    BoundCall* found = BoundCall::Find(Key(k));
    ASSERT_NE(found, nullptr) << k;
    RunScaled(found, x, 1.0f, &y);  // Releases the primitive the find holds.
  }
}

TEST(BoundCallTest, ExecuteNeedsAFindOrInsertFirst) {
  PrimitiveCache cache(4);
  BoundCall* call = Bind(Key(300), Matmul(cache, "m", 1), 1);
  std::vector<float> x(4, 1.0f), y;
  RunScaled(call, x, 1.0f, &y);
  EXPECT_THAT(call->Execute(), StatusIs(absl::StatusCode::kInternal, HasSubstr("without Find")));
}

TEST(BoundCallTest, AnArgumentNotBoundFailsTheCall) {
  PrimitiveCache cache(4);
  BoundCall* call = Bind(Key(301), Matmul(cache, "m", 1), 1);
  std::vector<float> x(4, 1.0f), w(16, 0.0f), y(4, -1.0f);
  call->Set(DNNL_ARG_SRC, x.data());
  call->Set(DNNL_ARG_WEIGHTS, w.data());
  call->Set(DNNL_ARG_DST, y.data());
  call->Set(DNNL_ARG_BIAS, x.data());
  EXPECT_THAT(call->Execute(), StatusIs(absl::StatusCode::kInternal, HasSubstr("not given")));
  EXPECT_EQ(y[0], -1.0f);  // Not run.
  // The entry still works once found again.
  call = BoundCall::Find(Key(301));
  ASSERT_NE(call, nullptr);
  RunScaled(call, x, 2.0f, &y);
  EXPECT_EQ(y[0], 2.0f);
}

// The engine's projections find their bound calls by a key that must tell
// engines apart: engines of the same shape alternating on one thread, and
// one made where a destroyed one was, each compute with their own weights.
TEST(BoundCallTest, EnginesSharingAThreadUseTheirOwnWeights) {
  std::mt19937 rng(5);
  Tensor q = RandomTensor({1, 6, 16}, rng);
  MhaInputs in;
  in.query = q.view();
  auto check = [&](const MhaEngine& engine, const MhaModel& model) {
    auto out = engine.Forward(in);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_LE(MaxExcess(out->output.as<float>(), ReferenceMha(model, in).output, 1e-5), 1e-6);
  };
  MhaSpec spec = testing::SelfAttentionSpec(16, 2);
  spec.bias = true;
  auto model_a = MhaModel::Random(spec, 1);
  auto model_b = MhaModel::Random(spec, 2);
  ASSERT_TRUE(model_a.ok() && model_b.ok());
  auto a = MhaEngine::Create(*model_a);
  auto b = MhaEngine::Create(*model_b);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int i = 0; i < 3; ++i) {
    check(**a, **model_a);
    check(**b, **model_b);
  }
  for (uint32_t seed = 3; seed < 6; ++seed) {
    a->reset();
    auto model_c = MhaModel::Random(spec, seed);
    ASSERT_TRUE(model_c.ok());
    a = MhaEngine::Create(*model_c);
    ASSERT_TRUE(a.ok());
    check(**a, **model_c);
    check(**b, **model_b);
  }
}

}  // namespace
}  // namespace attention
