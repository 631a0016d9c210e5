#include "core/mha_model.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::testing::StatusIs;
using ::testing::HasSubstr;

Tensor Filled(Shape shape, DType dtype = DType::kFloat32) {
  Tensor t(DType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_as<float>()[i] = 0.01f * (i % 17);
  return t.ConvertTo(dtype);
}

// A packed E=8 layer with bias: the tensors PyTorch's state_dict has.
struct Layer {
  Tensor in_w = Filled({24, 8}), in_b = Filled({24}), out_w = Filled({8, 8}), out_b = Filled({8});
  std::map<std::string, const Tensor*> Map() const {
    return {{"in_proj_weight", &in_w},
            {"in_proj_bias", &in_b},
            {"out_proj.weight", &out_w},
            {"out_proj.bias", &out_b}};
  }
};

absl::StatusOr<std::shared_ptr<const MhaModel>> Build(
    const std::string& config, const std::map<std::string, const Tensor*>& t) {
  auto c = ParseModelConfig(config);
  if (!c.ok()) return c.status();
  auto st = SafeTensors::Parse(WriteSafeTensors(t));
  if (!st.ok()) return st.status();
  return MhaModel::FromTensors(*c, *st);
}

void ExpectInvalid(const std::string& config, const std::map<std::string, const Tensor*>& t,
                   const std::string& message) {
  EXPECT_THAT(Build(config, t), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
}

TEST(MhaModelTest, LoadsPackedLayer) {
  Layer layer;
  auto m = Build(R"({"num_heads": 2, "embed_dim": 8, "add_zero_attn": true})", layer.Map());
  ASSERT_TRUE(m.ok()) << m.status();
  const MhaSpec& s = (*m)->spec();
  EXPECT_EQ(s.embed_dim, 8);
  EXPECT_EQ(s.kdim, 8);
  EXPECT_TRUE(s.bias);
  EXPECT_FALSE(s.add_bias_kv);
  EXPECT_TRUE(s.add_zero_attn);
  // in_proj_weight rows split into q, k, v.
  EXPECT_EQ((*m)->weights().k_weight.as<float>()[0], layer.in_w.as<float>()[8 * 8]);
  EXPECT_EQ((*m)->weights().v_weight.shape(), (Shape{8, 8}));
}

TEST(MhaModelTest, LoadsSeparateProjectionsInHalfPrecision) {
  Tensor q = Filled({8, 8}, DType::kBFloat16), k = Filled({8, 6}, DType::kFloat16),
         v = Filled({8, 4}), out = Filled({8, 8}), bk = Filled({1, 1, 8}), bv = Filled({1, 1, 8});
  auto m = Build(R"({"num_heads": 4, "kdim": 6, "vdim": 4, "bias": false, "add_bias_kv": true})",
                 {{"q_proj_weight", &q},
                  {"k_proj_weight", &k},
                  {"v_proj_weight", &v},
                  {"out_proj.weight", &out},
                  {"bias_k", &bk},
                  {"bias_v", &bv}});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->spec().kdim, 6);
  EXPECT_EQ((*m)->spec().vdim, 4);
  EXPECT_FALSE((*m)->spec().bias);
  EXPECT_TRUE((*m)->spec().add_bias_kv);
  EXPECT_EQ((*m)->weights().bias_k.shape(), (Shape{8}));
  EXPECT_EQ((*m)->weights().k_weight.dtype(), DType::kFloat32);
  EXPECT_FLOAT_EQ((*m)->weights().k_weight.as<float>()[5], HalfToFloat(FloatToHalf(0.05f)));
}

TEST(MhaModelTest, RejectsMissingWrongAndUnexpectedTensors) {
  Layer layer;
  auto t = layer.Map();
  t.erase("in_proj_bias");
  ExpectInvalid(R"({"num_heads": 2})", t, "missing tensor 'in_proj_bias' of shape [24]");
  t = layer.Map();
  Tensor wrong = Filled({24, 4});
  t["in_proj_weight"] = &wrong;
  ExpectInvalid(R"({"num_heads": 2})", t,
                "tensor 'in_proj_weight' has shape [24, 4], expected [24, 8]");
  t = layer.Map();
  Tensor mask(DType::kBool, {8});
  t["out_proj.bias"] = &mask;
  ExpectInvalid(R"({"num_heads": 2})", t, "tensor 'out_proj.bias' has dtype bool");
  t = layer.Map();
  Tensor extra = Filled({3});
  t["extra.weight"] = &extra;
  ExpectInvalid(R"({"num_heads": 2})", t, "unexpected tensor 'extra.weight'");
  t = layer.Map();
  t.erase("out_proj.weight");
  ExpectInvalid(R"({"num_heads": 2})", t, "missing 2-D tensor 'out_proj.weight'");
}

TEST(MhaModelTest, RejectsConfigThatDisagreesWithTensors) {
  Layer layer;
  ExpectInvalid(R"({"num_heads": 2, "embed_dim": 16})", layer.Map(),
                "'embed_dim' is 16 but tensor 'out_proj.weight' implies 8");
  ExpectInvalid(R"({"num_heads": 2, "kdim": 4})", layer.Map(),
                "'kdim' is 4 but tensor 'in_proj_weight' implies 8");
  ExpectInvalid(R"({"num_heads": 2, "bias": false})", layer.Map(), "'bias' is false");
  ExpectInvalid(R"({"num_heads": 2, "add_bias_kv": true})", layer.Map(),
                "'add_bias_kv' is true but model.safetensors has no 'bias_k'/'bias_v'");
  ExpectInvalid(R"({"num_heads": 3})", layer.Map(), "embed_dim 8 is not divisible by num_heads 3");
  Tensor q = Filled({8, 8}), k = Filled({8, 8}), v = Filled({8, 8}), out = Filled({8, 8});
  ExpectInvalid(R"({"num_heads": 2, "bias": false})",
                {{"q_proj_weight", &q},
                 {"k_proj_weight", &k},
                 {"v_proj_weight", &v},
                 {"out_proj.weight", &out}},
                "PyTorch stores 'in_proj_weight'");
}

TEST(MhaModelTest, LoadsFromDirectory) {
  const std::string dir = ::testing::TempDir() + "/mha_model_test_dir";
  std::filesystem::create_directories(dir);
  EXPECT_THAT(MhaModel::LoadFromDirectory(dir),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("config.json")));
  std::ofstream(dir + "/config.json") << R"({"num_heads": 2, "max_batch_size": 4})";
  EXPECT_THAT(MhaModel::LoadFromDirectory(dir),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("model.safetensors")));
  Layer layer;
  std::ofstream(dir + "/model.safetensors", std::ios::binary) << WriteSafeTensors(layer.Map());
  auto m = MhaModel::LoadFromDirectory(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*(*m)->serving().max_batch_size, 4);
  std::ofstream(dir + "/config.json") << R"({"num_heads": 2, "typo": 1})";
  EXPECT_THAT(MhaModel::LoadFromDirectory(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mha_model_test_dir: config.json: unknown key 'typo'")));
  std::filesystem::remove_all(dir);
}

// ReadSpec resolves the spec LoadFromDirectory would, from config.json and
// the safetensors header alone (the memory estimate before a load).
TEST(MhaModelTest, ReadSpecMatchesTheLoadedSpec) {
  const std::string dir = ::testing::TempDir() + "/mha_model_spec_dir";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"num_heads": 2, "compute_dtype": "bfloat16"})";
  Tensor q = Filled({8, 8}), k = Filled({8, 4}), v = Filled({8, 6}), out = Filled({8, 8});
  std::ofstream(dir + "/model.safetensors", std::ios::binary)
      << WriteSafeTensors({{"q_proj_weight", &q},
                           {"k_proj_weight", &k},
                           {"v_proj_weight", &v},
                           {"out_proj.weight", &out}});
  auto spec = MhaModel::ReadSpec(dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto m = MhaModel::LoadFromDirectory(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  const MhaSpec& want = (*m)->spec();
  EXPECT_EQ(spec->embed_dim, want.embed_dim);
  EXPECT_EQ(spec->kdim, 4);
  EXPECT_EQ(spec->vdim, 6);
  EXPECT_EQ(spec->bias, want.bias);
  EXPECT_EQ(spec->compute_dtype, DType::kBFloat16);
  std::ofstream(dir + "/config.json") << R"({"num_heads": 3})";
  EXPECT_THAT(MhaModel::ReadSpec(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not divisible")));
  std::filesystem::remove_all(dir);
}

// A load told to stop (a drain, a stop signal) stops between chunks of its
// reading: asked before each file's chunks and before parsing.
TEST(MhaModelTest, AbandonedLoadStopsWithCancelled) {
  const std::string dir = ::testing::TempDir() + "/mha_model_abandon_dir";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"num_heads": 2})";
  Layer layer;
  std::ofstream(dir + "/model.safetensors", std::ios::binary) << WriteSafeTensors(layer.Map());
  int asked = 0;
  auto m = MhaModel::LoadFromDirectory(dir, [&] { return ++asked > 100; });
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GE(asked, 3);  // config.json, model.safetensors' header and tensors, before parsing.
  for (int stop_at : {1, 2, 3}) {
    asked = 0;
    EXPECT_THAT(MhaModel::LoadFromDirectory(dir, [&] { return ++asked >= stop_at; }),
                StatusIs(absl::StatusCode::kCancelled, HasSubstr("abandoned")))
        << "stopped at check " << stop_at;
    EXPECT_EQ(asked, stop_at);
  }
  std::filesystem::remove_all(dir);
}

TEST(MhaModelTest, LoadsFromBytes) {
  Layer layer;
  const std::string safetensors = WriteSafeTensors(layer.Map());
  auto m = MhaModel::FromBytes(R"({"num_heads": 2, "embed_dim": 8})", safetensors);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->spec().embed_dim, 8);
  EXPECT_EQ((*m)->spec().num_heads, 2);
  EXPECT_THAT(MhaModel::FromBytes("{", safetensors),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("config.json: not valid")));
  EXPECT_THAT(MhaModel::FromBytes(R"({"num_heads": 2})", safetensors.substr(0, 20)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("safetensors: file is")));
  EXPECT_THAT(MhaModel::FromBytes(R"({"num_heads": 2, "embed_dim": 16})", safetensors),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'embed_dim' is 16 but tensor 'out_proj.weight' implies 8")));
}

TEST(MhaModelTest, RefusesShapesThatWouldOverflowAtLoad) {
  // [2^32, 2^32] float32 is 2^66 bytes, which wraps to 0 in unchecked int64
  // arithmetic: with data_offsets [0, 0] it used to pass every check, make
  // embed_dim 2^32 and crash the load.
  const std::string dir = ::testing::TempDir() + "/mha_model_overflow_dir";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"num_heads": 1})";
  const std::string header =
      R"({"in_proj_weight":{"dtype":"F32","shape":[12884901888,4294967296],"data_offsets":[0,0]},)"
      R"("out_proj.weight":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(header.size() >> (8 * i));
  std::ofstream(dir + "/model.safetensors", std::ios::binary) << bytes + header;
  EXPECT_THAT(MhaModel::LoadFromDirectory(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor 'in_proj_weight': shape entry 12884901888 exceeds")));
  std::filesystem::remove_all(dir);
}

TEST(MhaModelTest, DemoAndRandomModels) {
  auto demo = MhaModel::Demo();
  EXPECT_EQ(demo->spec().embed_dim, 256);
  EXPECT_EQ(demo->spec().num_heads, 8);
  EXPECT_TRUE(demo->spec().bias);
  // Fixed seed: the same weights every time.
  EXPECT_EQ(demo->weights().q_weight.as<float>()[17],
            MhaModel::Demo()->weights().q_weight.as<float>()[17]);
  MhaSpec bad;
  bad.num_heads = 7;
  EXPECT_THAT(MhaModel::Random(bad, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not divisible")));
}

}  // namespace
}  // namespace attention
