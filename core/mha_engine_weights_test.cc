// MhaEngine's prepared weights (mha_engine_prepare.cc): every layout the
// packing takes gives the reference's numbers — q, k and v as thirds of one
// fused buffer (E % 64 == 0), separate buffers (E not a multiple of 64 or of
// 16, kdim/vdim != E), the per-item calls of appended keys, bfloat16 and
// int8 — and an engine that drops the model's matrices answers exactly as
// one that keeps them, with resident_bytes() equal to its estimate.
#include <random>

#include "absl/strings/str_cat.h"
#include "core/mha_engine.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using testing::MaxExcess;
using testing::RandomMask;
using testing::RandomTensor;
using testing::ReferenceMha;

struct Layer {
  int64_t e, h, kdim, vdim;
  bool bias_kv, zero_attn;
  DType compute;
  bool fused;  // Expected has_fused_qkv() in float.
};

std::string Name(const Layer& l) {
  return absl::StrCat("E", l.e, " H", l.h, " k", l.kdim, " v", l.vdim, l.bias_kv ? " bias_kv" : "",
                      l.zero_attn ? " zero_attn" : "", " ", DTypeName(l.compute));
}

MhaSpec SpecOf(const Layer& l) {
  MhaSpec s = testing::SelfAttentionSpec(l.e, l.h);
  s.kdim = l.kdim;
  s.vdim = l.vdim;
  s.add_bias_kv = l.bias_kv;
  s.add_zero_attn = l.zero_attn;
  s.compute_dtype = l.compute;
  return s;
}

const Layer kLayers[] = {
    {64, 4, 64, 64, false, false, DType::kFloat32, true},    // Fused thirds.
    {128, 8, 128, 128, true, true, DType::kFloat32, true},   // Fused; appended keys.
    {40, 4, 40, 40, false, false, DType::kFloat32, false},   // E % 16 != 0.
    {96, 4, 96, 96, true, false, DType::kFloat32, false},    // E % 64 != 0.
    {64, 4, 24, 40, false, true, DType::kFloat32, false},    // kdim, vdim != E.
    {64, 4, 64, 64, true, true, DType::kBFloat16, true},     // bfloat16 thirds.
    {40, 4, 40, 40, false, false, DType::kBFloat16, false},  // bfloat16 separate.
};

TEST(MhaEngineWeightsTest, EveryLayoutMatchesTheReference) {
  uint32_t seed = 1;
  for (const Layer& l : kLayers) {
    SCOPED_TRACE(Name(l));
    const MhaSpec spec = SpecOf(l);
    auto model = MhaModel::Random(spec, seed);
    ASSERT_TRUE(model.ok()) << model.status();
    auto engine = MhaEngine::Create(*model);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_EQ((*engine)->has_fused_qkv(), l.fused);
    const bool bf16 = l.compute == DType::kBFloat16;
    const double tol = bf16 ? 2e-2 : 1e-5, atol = bf16 ? 2e-2 : 1e-6;
    std::mt19937 rng(seed++);
    for (bool self : {true, false}) {
      if (self && !spec.packed_in_proj()) continue;
      // Three items: batches of K/V blocks written with a stride when keys
      // are appended.
      Tensor q = RandomTensor({3, 9, l.e}, rng);
      Tensor k = RandomTensor({3, 7, l.kdim}, rng);
      Tensor v = RandomTensor({3, 7, l.vdim}, rng);
      Tensor kpm = RandomMask({3, self ? 9 : 7}, rng, 0.25);
      MhaInputs in;
      in.query = q.view();
      if (!self) {
        in.key = k.view();
        in.value = v.view();
      }
      in.key_padding_mask = kpm.view();
      in.need_weights = true;
      auto out = (*engine)->Forward(in);
      ASSERT_TRUE(out.ok()) << out.status();
      testing::Reference ref = ReferenceMha(**model, in);
      EXPECT_LE(MaxExcess(out->output.as<float>(), ref.output, tol), atol) << "self " << self;
    }
  }
}

TEST(MhaEngineWeightsTest, FusedProjectionIsTheThreeParts) {
  for (const Layer& l : kLayers) {
    if (!l.fused) continue;
    SCOPED_TRACE(Name(l));
    for (bool int8 : {false, true}) {
      auto model = MhaModel::Random(SpecOf(l), 7);
      EngineOptions options;
      options.int8_weights = int8;
      auto engine = MhaEngine::Create(*model, options);
      ASSERT_TRUE(engine.ok()) << engine.status();
      ASSERT_TRUE((*engine)->has_fused_qkv());
      std::mt19937 rng(7);
      const int64_t rows = 5, e = l.e;
      Tensor x = RandomTensor({rows, e}, rng);
      std::vector<float> qkv(rows * 3 * e), part(rows * e);
      ASSERT_TRUE((*engine)->Project(MhaEngine::Part::kQueryKeyValue, x.view(), qkv.data()).ok());
      const MhaEngine::Part parts[] = {MhaEngine::Part::kQuery, MhaEngine::Part::kKey,
                                       MhaEngine::Part::kValue};
      for (int j = 0; j < 3; ++j) {
        ASSERT_TRUE((*engine)->Project(parts[j], x.view(), part.data()).ok());
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < e; ++c) {
            ASSERT_FLOAT_EQ(part[r * e + c], qkv[r * 3 * e + j * e + c])
                << "int8 " << int8 << " part " << j << " row " << r << " col " << c;
          }
        }
      }
    }
  }
}

TEST(MhaEngineWeightsTest, DroppingTheModelMatricesChangesNoOutput) {
  uint32_t seed = 30;
  for (const Layer& l : kLayers) {
    for (bool int8 : {false, true}) {
      SCOPED_TRACE(absl::StrCat(Name(l), int8 ? " int8" : ""));
      auto model = MhaModel::Random(SpecOf(l), seed);
      EngineOptions keep, drop;
      keep.int8_weights = drop.int8_weights = int8;
      drop.keep_model_weights = false;
      auto kept = MhaEngine::Create(*model, keep);
      auto dropped = MhaEngine::Create(*model, drop);
      ASSERT_TRUE(kept.ok() && dropped.ok());
      EXPECT_EQ((*dropped)->model().weights().q_weight.data(), nullptr);
      EXPECT_NE((*kept)->model().weights().q_weight.data(), nullptr);
      EXPECT_EQ((*dropped)->model().spec().embed_dim, l.e);
      // The matrices' bytes are all the difference.
      const int64_t matrices = 4 * l.e * (2 * l.e + l.kdim + l.vdim);
      EXPECT_EQ((*kept)->resident_bytes() - (*dropped)->resident_bytes(), matrices);
      auto estimate = MhaEngine::EstimateResidentBytes((*model)->spec(), drop);
      ASSERT_TRUE(estimate.ok()) << estimate.status();
      EXPECT_EQ(*estimate, (*dropped)->resident_bytes());

      std::mt19937 rng(seed++);
      Tensor q = RandomTensor({2, 6, l.e}, rng);
      Tensor k = RandomTensor({2, 5, l.kdim}, rng);
      Tensor v = RandomTensor({2, 5, l.vdim}, rng);
      MhaInputs in;
      in.query = q.view();
      in.key = k.view();
      in.value = v.view();
      auto a = (*kept)->Forward(in);
      auto b = (*dropped)->Forward(in);
      ASSERT_TRUE(a.ok() && b.ok());
      for (int64_t i = 0; i < a->output.num_elements(); ++i) {
        ASSERT_EQ(a->output.as<float>()[i], b->output.as<float>()[i]) << i;
      }
      // A model without matrices cannot make another engine.
      auto again = MhaEngine::Create((*dropped)->shared_model());
      EXPECT_EQ(again.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

TEST(MhaEngineWeightsTest, OneCopyOfTheWeights) {
  // E=256 (the demo's shape), the weights 4 E^2 float32: packed once, float32
  // takes them once, bfloat16 half, int8 a quarter (plus per-channel vectors,
  // 3% at this size).
  for (DType compute : {DType::kFloat32, DType::kBFloat16}) {
    for (bool int8 : {false, true}) {
      MhaSpec spec = testing::SelfAttentionSpec(256, 8);
      spec.compute_dtype = compute;
      EngineOptions options;
      options.int8_weights = int8;
      options.keep_model_weights = false;
      auto engine = MhaEngine::Create(*MhaModel::Random(spec, 3), options);
      ASSERT_TRUE(engine.ok());
      const double file = 4.0 * 256 * 256 * 4;
      const double ratio = (*engine)->resident_bytes() / file;
      const double want = int8 ? 0.25 : compute == DType::kFloat32 ? 1.0 : 0.5;
      EXPECT_GT(ratio, want) << DTypeName(compute) << " int8 " << int8;
      EXPECT_LT(ratio, want + 0.04) << DTypeName(compute) << " int8 " << int8;
    }
  }
}

}  // namespace
}  // namespace attention
