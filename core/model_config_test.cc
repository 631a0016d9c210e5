#include "core/model_config.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::testing::StatusIs;
using ::testing::HasSubstr;

void ExpectInvalid(const std::string& json, const std::string& message) {
  EXPECT_THAT(ParseModelConfig(json),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
}

TEST(ModelConfigTest, ParsesEveryKey) {
  auto c = ParseModelConfig(R"({"num_heads": 4, "embed_dim": 64, "kdim": 32, "vdim": 16,
      "bias": false, "add_bias_kv": true, "add_zero_attn": true, "compute_dtype": "bfloat16",
      "max_batch_size": 8, "max_batch_tokens": 4096, "max_queue_delay_us": 500,
      "max_queue_size": 128, "max_sessions": 10, "max_session_tokens": 2048,
      "session_ttl_s": 60, "session_cache_dtype": "bfloat16"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_heads, 4);
  EXPECT_EQ(*c->embed_dim, 64);
  EXPECT_EQ(*c->kdim, 32);
  EXPECT_EQ(*c->vdim, 16);
  EXPECT_FALSE(*c->bias);
  EXPECT_TRUE(*c->add_bias_kv);
  EXPECT_TRUE(c->add_zero_attn);
  EXPECT_EQ(c->compute_dtype, DType::kBFloat16);
  EXPECT_EQ(*c->serving.max_batch_size, 8);
  EXPECT_EQ(*c->serving.max_batch_tokens, 4096);
  EXPECT_EQ(*c->serving.max_queue_delay_us, 500);
  EXPECT_EQ(*c->serving.max_queue_size, 128);
  EXPECT_EQ(*c->serving.max_sessions, 10);
  EXPECT_EQ(*c->serving.max_session_tokens, 2048);
  EXPECT_EQ(*c->serving.session_ttl_s, 60);
  EXPECT_EQ(*c->serving.session_cache_dtype, DType::kBFloat16);
}

TEST(ModelConfigTest, OnlyNumHeadsIsRequired) {
  auto c = ParseModelConfig(R"({"num_heads": 2})");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->embed_dim.has_value());
  EXPECT_FALSE(c->bias.has_value());
  EXPECT_FALSE(c->add_zero_attn);
  EXPECT_EQ(c->compute_dtype, DType::kFloat32);
  EXPECT_FALSE(c->int8_weights);
  EXPECT_FALSE(c->serving.max_batch_size.has_value());
}

TEST(ModelConfigTest, BatchFirstDefaultsToTrueAndRecordsPyTorchsDefaultLayout) {
  // Folders exported before the key existed were served batch-first.
  auto absent = ParseModelConfig(R"({"num_heads": 2})");
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_TRUE(absent->serving.batch_first);
  for (const bool batch_first : {false, true}) {
    auto c = ParseModelConfig(
        absl::StrCat(R"({"num_heads": 2, "batch_first": )", batch_first ? "true" : "false", "}"));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->serving.batch_first, batch_first);
  }
  ExpectInvalid(R"({"num_heads": 2, "batch_first": "false"})",
                "'batch_first' must be true or false, got \"false\"");
}

TEST(ModelConfigTest, Int8MeansInt8ProjectionsAndBFloat16Attention) {
  auto c = ParseModelConfig(R"({"num_heads": 2, "compute_dtype": "int8"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->int8_weights);
  EXPECT_EQ(c->compute_dtype, DType::kBFloat16);
}

TEST(ModelConfigTest, RejectsBadConfigs) {
  ExpectInvalid("{", "not valid JSON");
  ExpectInvalid("[]", "not a JSON object");
  ExpectInvalid(R"({"embed_dim": 8})", "'num_heads' is required");
  ExpectInvalid(R"({"num_heads": 0})", "'num_heads' must be an integer >= 1, got 0");
  ExpectInvalid(R"({"num_heads": "8"})", "'num_heads' must be an integer >= 1, got \"8\"");
  ExpectInvalid(R"({"num_heads": 2, "bias": 1})", "'bias' must be true or false, got 1");
  ExpectInvalid(R"({"num_heads": 2, "compute_dtype": "float16"})",
                "'compute_dtype' must be \"float32\", \"bfloat16\" or \"int8\", got \"float16\"");
  ExpectInvalid(R"({"num_heads": 2, "dropout": 0.1})", "unknown key 'dropout'");
  ExpectInvalid(R"({"num_heads": 2, "session_cache_dtype": "float16"})",
                "'session_cache_dtype' must be \"float32\" or \"bfloat16\", got \"float16\"");
  ExpectInvalid(R"({"num_heads": 2, "max_session_tokens": 0})",
                "'max_session_tokens' must be an integer >= 1, got 0");
  ExpectInvalid(R"({"num_heads": 3, "embed_dim": 8})",
                "embed_dim 8 is not divisible by num_heads 3");
  ExpectInvalid(R"({"num_heads": 2, "max_queue_delay_us": -1})",
                "'max_queue_delay_us' must be an integer >= 0, got -1");
  ExpectInvalid(R"({"num_heads": 2, "max_batch_size": 0})", "'max_batch_size' must be");
}

}  // namespace
}  // namespace attention
