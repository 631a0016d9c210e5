// MhaEngine with int8 projections (config.json "compute_dtype": "int8", or
// EngineOptions::int8_weights on a float32 model): close to the float32
// engine on every projection path (the fused q/k/v projection; separate
// ones with kdim/vdim, appended keys and batch blocks written with a stride;
// Project() for sessions), NaN where float32 gives NaN, and loaded from a
// model directory. The golden cases' error is bounded in golden_test.
#include <cmath>
#include <filesystem>
#include <random>

#include "core/mha_engine.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using testing::RandomTensor;

// max |a - b| / max |b|: the error relative to the output's scale.
double ScaledError(const Tensor& a, const Tensor& b) {
  double err = 0, ref = 0;
  for (int64_t i = 0; i < b.num_elements(); ++i) {
    err = std::max<double>(err, std::abs(a.as<float>()[i] - b.as<float>()[i]));
    ref = std::max<double>(ref, std::abs(b.as<float>()[i]));
  }
  return err / ref;
}

struct Engines {
  std::unique_ptr<MhaEngine> f32, int8;
};

Engines Make(const MhaSpec& spec, uint64_t seed) {
  auto model = MhaModel::Random(spec, seed);
  EngineOptions int8;
  int8.int8_weights = true;
  Engines e;
  e.f32 = std::move(MhaEngine::Create(*model).value());
  e.int8 = std::move(MhaEngine::Create(*model, int8).value());
  return e;
}

TEST(MhaEngineInt8Test, SelfAttentionIsCloseToFloat32) {
  std::mt19937 rng(1);
  Engines e = Make(testing::SelfAttentionSpec(64, 4), 1);
  MhaInputs in;
  Tensor q = RandomTensor({2, 37, 64}, rng);
  in.query = q.view();
  in.is_causal = true;
  auto want = e.f32->Forward(in);
  auto got = e.int8->Forward(in);
  ASSERT_TRUE(want.ok() && got.ok()) << got.status();
  EXPECT_LE(ScaledError(got->output, want->output), 0.035);
}

TEST(MhaEngineInt8Test, CrossAttentionWithAppendedKeysIsCloseToFloat32) {
  std::mt19937 rng(2);
  MhaSpec spec = testing::SelfAttentionSpec(48, 3);
  spec.kdim = 40;
  spec.vdim = 24;
  spec.add_bias_kv = true;
  spec.add_zero_attn = true;
  Engines e = Make(spec, 2);
  Tensor q = RandomTensor({3, 9, 48}, rng), k = RandomTensor({3, 21, 40}, rng),
         v = RandomTensor({3, 21, 24}, rng);
  MhaInputs in;
  in.query = q.view();
  in.key = k.view();
  in.value = v.view();
  in.need_weights = true;
  auto want = e.f32->Forward(in);
  auto got = e.int8->Forward(in);
  ASSERT_TRUE(want.ok() && got.ok()) << got.status();
  EXPECT_LE(ScaledError(got->output, want->output), 0.035);
  EXPECT_LE(ScaledError(*got->attn_weights, *want->attn_weights), 0.05);
}

TEST(MhaEngineInt8Test, ProjectIsCloseToFloat32) {
  std::mt19937 rng(3);
  Engines e = Make(testing::SelfAttentionSpec(64, 4), 3);
  Tensor x = RandomTensor({11, 64}, rng);
  for (auto part :
       {MhaEngine::Part::kQuery, MhaEngine::Part::kQueryKeyValue, MhaEngine::Part::kOut}) {
    const int64_t out = part == MhaEngine::Part::kQueryKeyValue ? 3 * 64 : 64;
    Tensor want(DType::kFloat32, {11, out}), got(DType::kFloat32, {11, out});
    ASSERT_TRUE(e.f32->Project(part, x.view(), want.mutable_as<float>()).ok());
    ASSERT_TRUE(e.int8->Project(part, x.view(), got.mutable_as<float>()).ok());
    EXPECT_LE(ScaledError(got, want), 0.02) << static_cast<int>(part);
  }
}

TEST(MhaEngineInt8Test, NaNInAQueryRowStaysNaN) {
  std::mt19937 rng(4);
  Engines e = Make(testing::SelfAttentionSpec(32, 2), 4);
  Tensor q = RandomTensor({1, 5, 32}, rng);
  q.mutable_as<float>()[2 * 32 + 3] = std::nanf("");
  MhaInputs in;
  in.query = q.view();
  in.is_causal = true;  // Rows before the NaN token do not see it.
  auto want = e.f32->Forward(in);
  auto got = e.int8->Forward(in);
  ASSERT_TRUE(want.ok() && got.ok());
  for (int64_t i = 0; i < 5 * 32; ++i) {
    EXPECT_EQ(std::isnan(got->output.as<float>()[i]), std::isnan(want->output.as<float>()[i])) << i;
  }
}

TEST(MhaEngineInt8Test, ConfigInt8LoadsAnInt8Model) {
  auto model = MhaModel::Random(testing::SelfAttentionSpec(32, 2), 5);
  MhaSpec spec = (*model)->spec();
  spec.int8_weights = true;
  spec.compute_dtype = DType::kBFloat16;
  auto int8_model = MhaModel::Random(spec, 5);  // Same seed: same weights.
  const std::string dir = ::testing::TempDir() + "/mha_engine_int8_dir";
  std::filesystem::create_directories(dir);
  testing::WriteModelDir(**int8_model, dir);
  auto loaded = MhaModel::LoadFromDirectory(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE((*loaded)->spec().int8_weights);
  EXPECT_EQ((*loaded)->spec().compute_dtype, DType::kBFloat16);
  auto from_config = MhaEngine::Create(*loaded);
  EngineOptions int8;
  int8.int8_weights = true;
  auto from_options = MhaEngine::Create(*model, int8);
  ASSERT_TRUE(from_config.ok() && from_options.ok());
  std::mt19937 rng(5);
  Tensor q = RandomTensor({2, 6, 32}, rng);
  MhaInputs in;
  in.query = q.view();
  auto a = (*from_config)->Forward(in);
  auto b = (*from_options)->Forward(in);
  ASSERT_TRUE(a.ok() && b.ok());
  // The same quantized layer either way.
  for (int64_t i = 0; i < 2 * 6 * 32; ++i) {
    ASSERT_EQ(a->output.as<float>()[i], b->output.as<float>()[i]) << i;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace attention
