// Conformance against PyTorch: every case in tests/golden/cases (written by
// tests/golden/generate.py from torch.nn.MultiheadAttention) run through the
// engine and compared with its stated tolerances.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/mha_engine.h"
#include "core/safetensors.h"
#include "core/sdpa.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace attention {
namespace {

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(GOLDEN_DIR)) {
    if (entry.is_directory()) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::optional<TensorView> Optional(const SafeTensors& st, const char* name) {
  const Tensor* t = st.Find(name);
  if (t == nullptr) return std::nullopt;
  return t->view();
}

// The case's description (case.json) in `dir`.
nlohmann::json ReadCase(const std::string& dir) {
  std::ifstream case_file(dir + "/case.json");
  return nlohmann::json::parse(case_file);
}

// The MHA inputs of case `c` from its tensors `io`, with float32 output
// (need_weights off).
MhaInputs CaseInputs(const SafeTensors& io, const nlohmann::json& c) {
  MhaInputs in;
  in.query = io.Find("query")->view();
  in.key = Optional(io, "key");
  in.value = Optional(io, "value");
  in.key_padding_mask = Optional(io, "key_padding_mask");
  in.attn_mask = Optional(io, "attn_mask");
  in.is_causal = c["is_causal"];
  in.output_dtype = DType::kFloat32;
  return in;
}

// Counts the elements outside atol + rtol * |expected| and reports the worst.
void ExpectClose(const Tensor& actual, const Tensor& expected, double atol, double rtol,
                 const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const Tensor a = actual.ConvertTo(DType::kFloat32);
  int64_t bad = 0, worst_index = 0;
  double worst = 0;
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    const double x = a.as<float>()[i], e = expected.as<float>()[i];
    const double excess = std::abs(x - e) - (atol + rtol * std::abs(e));
    if (std::isnan(x) || excess > 0) ++bad;
    if (std::isnan(x) || excess > worst) {
      worst = std::isnan(x) ? INFINITY : excess;
      worst_index = i;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.num_elements()
                    << " elements out of tolerance; worst at " << worst_index << ": "
                    << a.as<float>()[worst_index] << " vs " << expected.as<float>()[worst_index];
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesPyTorch) {
  const std::string dir = std::string(GOLDEN_DIR) + "/" + GetParam();
  const nlohmann::json c = ReadCase(dir);
  auto io = SafeTensors::ReadFile(dir + "/io.safetensors");
  ASSERT_TRUE(io.ok()) << io.status();
  const double atol = c["atol"], rtol = c["rtol"];
  SCOPED_TRACE(c["description"].get<std::string>());

  if (c["kind"] == "sdpa") {
    PrimitiveCache cache(16);
    SdpaInputs in;
    in.q = io->Find("q")->view();
    in.k = io->Find("k")->view();
    in.v = io->Find("v")->view();
    in.key_padding_mask = Optional(*io, "key_padding_mask");
    in.attn_mask = Optional(*io, "attn_mask");
    in.is_causal = c["is_causal"];
    auto out = ScaledDotProductAttention(in, cache);
    ASSERT_TRUE(out.ok()) << out.status();
    ExpectClose(*out, *io->Find("expected_output"), atol, rtol, "output");
    return;
  }

  auto model = MhaModel::LoadFromDirectory(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  auto engine = MhaEngine::Create(*model);
  ASSERT_TRUE(engine.ok()) << engine.status();
  MhaInputs in = CaseInputs(*io, c);
  in.need_weights = c["need_weights"];
  in.average_attn_weights = c["average_attn_weights"];
  auto out = (*engine)->Forward(in);
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectClose(out->output, *io->Find("expected_output"), atol, rtol, "output");
  if (in.need_weights) {
    ASSERT_TRUE(out->attn_weights.has_value());
    ExpectClose(*out->attn_weights, *io->Find("expected_attn_weights"), atol, rtol, "attn_weights");
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenTest, ::testing::ValuesIn(CaseNames()),
                         [](const auto& info) { return info.param; });

// int8 projections (weights quantized per output channel at load,
// activations per row) with bfloat16 attention, against the cases' float
// references: the error relative to the output's scale, per case
// max|y - ref| / max|ref| and mean|y - ref| / mean|ref|. README (int8) states
// the measured figures; the bounds here are about twice the worst seen.
TEST(GoldenInt8Test, StaysWithinItsStatedErrorOfFloat32) {
  constexpr double kMaxBound = 0.035, kMeanBound = 0.03;
  double worst_max = 0, worst_mean = 0, sum_mean = 0;
  int cases = 0;
  for (const std::string& name : CaseNames()) {
    const std::string dir = std::string(GOLDEN_DIR) + "/" + name;
    const nlohmann::json c = ReadCase(dir);
    if (c["kind"] != "mha") continue;
    auto io = SafeTensors::ReadFile(dir + "/io.safetensors");
    auto model = MhaModel::LoadFromDirectory(dir);
    ASSERT_TRUE(io.ok() && model.ok()) << name;
    EngineOptions options;
    options.int8_weights = true;
    auto engine = MhaEngine::Create(*model, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto out = (*engine)->Forward(CaseInputs(*io, c));
    ASSERT_TRUE(out.ok()) << name << ": " << out.status();
    const Tensor& ref = *io->Find("expected_output");
    double max_err = 0, max_ref = 0, sum_err = 0, sum_ref = 0;
    for (int64_t i = 0; i < ref.num_elements(); ++i) {
      const double y = out->output.as<float>()[i], r = ref.as<float>()[i];
      ASSERT_FALSE(std::isnan(y)) << name << " element " << i;
      max_err = std::max(max_err, std::abs(y - r));
      max_ref = std::max(max_ref, std::abs(r));
      sum_err += std::abs(y - r);
      sum_ref += std::abs(r);
    }
    const double rel_max = max_err / max_ref, rel_mean = sum_err / sum_ref;
    EXPECT_LE(rel_max, kMaxBound) << name;
    EXPECT_LE(rel_mean, kMeanBound) << name;
    worst_max = std::max(worst_max, rel_max);
    worst_mean = std::max(worst_mean, rel_mean);
    sum_mean += rel_mean;
    ++cases;
  }
  EXPECT_GE(cases, 30);
  std::printf(
      "int8 vs float32 over %d golden cases: max error / max |output| worst %.4f; "
      "mean error / mean |output| worst %.4f, average %.4f\n",
      cases, worst_max, worst_mean, sum_mean / cases);
}

TEST(GoldenSuiteTest, HasTheCases) {
  // Guards against a missing or emptied cases folder passing vacuously.
  EXPECT_GE(CaseNames().size(), 40u);
}

}  // namespace
}  // namespace attention
