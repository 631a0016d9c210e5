// NaN (and infinity) in, NaN out where PyTorch puts it, on every engine path:
// MhaEngine::Forward without weights (the fused kernel where the CPU has it;
// core_test_primitive_path runs the MhaEngine* and Sdpa* tests on the oneDNN
// primitives), with averaged and with per-head weights (the primitives),
// ScaledDotProductAttention, and sessions (the session kernel).
//
// The expected patterns are printed by tests/golden/nan_positions.py from
// PyTorch 1.13's nn.MultiheadAttention (the lines it marks follow the
// documented 2.x mask semantics and zero fully masked rows instead): one
// character per query row, 'N' every value NaN, 'n' some, '.' none, for
// "output averaged-weights head-0-weights head-1-weights". The positions do
// not depend on the finite values, so the cases are rebuilt here from random
// ones; the rows expected finite are also compared with the reference.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "core/kv_block_pool.h"
#include "core/memory_budget.h"
#include "core/mha_engine.h"
#include "core/sdpa.h"
#include "core/session_engine.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::testing::RandomTensor;

constexpr int64_t kE = 8, kH = 2, kL = 5, kS = 6;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// One character per row of `width` values (of which the first `used`).
std::string Pattern(const float* rows, int64_t count, int64_t width, int64_t used = -1) {
  if (used < 0) used = width;
  std::string p;
  for (int64_t r = 0; r < count; ++r) {
    int64_t nan = 0;
    for (int64_t c = 0; c < used; ++c) nan += std::isnan(rows[r * width + c]);
    p += nan == used ? 'N' : nan > 0 ? 'n' : '.';
  }
  return p;
}

// "N*300" -> 300 N's; other words as they are.
std::vector<std::string> Expected(const std::string& line) {
  std::vector<std::string> words = absl::StrSplit(line, ' ');
  for (std::string& w : words) {
    const size_t star = w.find('*');
    if (star != std::string::npos) w = std::string(std::stoul(w.substr(star + 1)), w[0]);
  }
  return words;
}

struct MhaNanCase {
  std::string name;
  std::string expected;  // From nan_positions.py.
  bool cross = false, causal = false;
  int64_t queries = kL;
  int64_t q_token = -1;  // query[q_token][3] = q_value.
  float q_value = kNaN;
  int64_t k_token = -1, v_token = -1;  // key[k_token][1], value[v_token][5] = NaN.
  std::vector<float> kpm;              // (S) float32, or empty.
  int64_t kpm_true = -1;               // A bool key_padding_mask ignoring this key.
  std::vector<float> am;               // (L, S) float32, or empty.
};

std::vector<float> MaskRows(float fill) { return std::vector<float>(kL * kS, fill); }

std::vector<MhaNanCase> MhaCases() {
  std::vector<MhaNanCase> c;
  auto add = [&](std::string name, std::string expected) -> MhaNanCase& {
    c.emplace_back();
    c.back().name = std::move(name);
    c.back().expected = std::move(expected);
    return c.back();
  };
  add("self_nan_token", "NNNNN NNNNN NNNNN NNNNN").q_token = 2;
  {
    MhaNanCase& x = add("self_nan_token_causal", "NNNNN NNNNN NNNNN NNNNN");
    x.q_token = 2;
    x.causal = true;
  }
  add("cross_nan_query", "..N.. ..N.. ..N.. ..N..").q_token = 2;
  {
    MhaNanCase& x = add("cross_inf_query", "..N.. ..N.. ..N.. ..N..");
    x.q_token = 2;
    x.q_value = kInf;
  }
  {
    MhaNanCase& x = add("cross_nan_query_causal", "..N.. ..N.. ..N.. ..N..");
    x.q_token = 2;
    x.causal = true;
  }
  add("cross_nan_key", "NNNNN NNNNN NNNNN NNNNN").k_token = 3;
  {
    MhaNanCase& x = add("cross_nan_key_causal", "NNNNN NNNNN NNNNN NNNNN");
    x.k_token = 3;
    x.causal = true;
  }
  {
    MhaNanCase& x = add("cross_nan_key_masked", "NNNNN NNNNN NNNNN NNNNN");
    x.k_token = 3;
    x.kpm_true = 3;
  }
  {
    MhaNanCase& x = add("cross_nan_value_masked", "NNNNN ..... ..... .....");
    x.v_token = 3;
    x.kpm_true = 3;
  }
  add("all_nan_float_kpm", "NNNNN NNNNN NNNNN NNNNN").kpm.assign(kS, kNaN);
  add("all_nan_float_attn_mask", "NNNNN NNNNN NNNNN NNNNN").am = MaskRows(kNaN);
  add("nan_attn_mask_entry", ".N... .N... .N... .N...").am = MaskRows(0);
  c.back().am[1 * kS + 2] = kNaN;
  add("nan_kpm_entry", "NNNNN NNNNN NNNNN NNNNN").kpm = {0, 0, 0, 0, kNaN, 0};
  {
    MhaNanCase& x = add("nan_attn_mask_under_bool_kpm", ".N... .N... .N... .N...");
    x.am = MaskRows(0);
    x.am[1 * kS + 3] = kNaN;
    x.kpm_true = 3;
  }
  {
    MhaNanCase& x = add("masked_row_with_nan_entry", ".N... .N... .N... .N...");
    x.am = MaskRows(-kInf);
    for (int64_t i = 0; i < kL; ++i) x.am[i * kS] = i == 1 ? -kInf : 0.0f;
    x.am[1 * kS + 2] = kNaN;
  }
  std::vector<float> row1_masked = MaskRows(0);
  std::fill_n(row1_masked.begin() + kS, kS, -kInf);
  add("fully_masked_row", "..... ..... ..... .....").am = row1_masked;
  {
    MhaNanCase& x = add("fully_masked_row_nan_query", ".N... .N... .N... .N...");
    x.am = row1_masked;
    x.q_token = 1;
  }
  {
    MhaNanCase& x = add("fully_masked_row_nan_value", "NNNNN ..... ..... .....");
    x.am = row1_masked;
    x.v_token = 2;
  }
  {
    MhaNanCase& x = add("self_late_nan_token_causal", "N*300 N*300 N*300 N*300");
    x.queries = 300;
    x.q_token = 290;
    x.causal = true;
  }
  for (MhaNanCase& x : c) {
    x.cross = x.name.rfind("self", 0) != 0;
  }
  return c;
}

void RunMhaCase(const MhaNanCase& c, const MhaModel& model, const MhaEngine& engine, double tol,
                uint32_t seed) {
  SCOPED_TRACE(c.name);
  std::mt19937 rng(seed);
  const int64_t l = c.queries, s = c.cross ? kS : l;
  Tensor q = RandomTensor({1, l, kE}, rng), k = RandomTensor({1, s, kE}, rng),
         v = RandomTensor({1, s, kE}, rng);
  if (c.q_token >= 0) q.mutable_as<float>()[c.q_token * kE + 3] = c.q_value;
  if (c.k_token >= 0) k.mutable_as<float>()[c.k_token * kE + 1] = kNaN;
  if (c.v_token >= 0) v.mutable_as<float>()[c.v_token * kE + 5] = kNaN;
  Tensor kpm(c.kpm_true >= 0 ? DType::kBool : DType::kFloat32, {1, s});
  if (c.kpm_true >= 0) kpm.mutable_as<uint8_t>()[c.kpm_true] = 1;
  if (!c.kpm.empty()) std::copy(c.kpm.begin(), c.kpm.end(), kpm.mutable_as<float>());
  Tensor am(DType::kFloat32, {l, s});
  if (!c.am.empty()) std::copy(c.am.begin(), c.am.end(), am.mutable_as<float>());

  const std::vector<std::string> want = Expected(c.expected);
  for (int mode = 0; mode < 3; ++mode) {  // No weights, averaged, per head.
    MhaInputs in;
    in.query = q.view();
    if (c.cross) {
      in.key = k.view();
      in.value = v.view();
    }
    if (c.kpm_true >= 0 || !c.kpm.empty()) in.key_padding_mask = kpm.view();
    if (!c.am.empty()) in.attn_mask = am.view();
    in.is_causal = c.causal;
    in.need_weights = mode > 0;
    in.average_attn_weights = mode == 1;
    SCOPED_TRACE(mode == 0 ? "no weights" : mode == 1 ? "averaged weights" : "per-head weights");
    auto out = engine.Forward(in);
    ASSERT_TRUE(out.ok()) << out.status();
    const float* o = out->output.as<float>();
    EXPECT_EQ(Pattern(o, l, kE), want[0]);
    const testing::Reference ref = testing::ReferenceMha(model, in);
    for (int64_t i = 0; i < l; ++i) {
      if (want[0][i] != '.') continue;
      for (int64_t f = 0; f < kE; ++f) {
        const double r = ref.output[i * kE + f];
        ASSERT_NEAR(o[i * kE + f], r, tol + tol * std::abs(r)) << "row " << i;
      }
    }
    if (mode == 0) continue;
    const float* w = out->attn_weights->as<float>();
    if (mode == 1) {
      EXPECT_EQ(Pattern(w, l, s), want[1]);
      continue;
    }
    for (int64_t h = 0; h < kH; ++h) {
      EXPECT_EQ(Pattern(w + h * l * s, l, s), want[2 + h]) << "head " << h;
      for (int64_t i = 0; i < l; ++i) {
        if (want[2 + h][i] != '.') continue;
        for (int64_t j = 0; j < s; ++j) {
          ASSERT_NEAR(w[(h * l + i) * s + j], ref.weights[(h * l + i) * s + j], tol)
              << "head " << h << " row " << i;
        }
      }
    }
  }
}

void RunMhaCases(DType compute, double tol) {
  MhaSpec spec = testing::SelfAttentionSpec(kE, kH);
  spec.compute_dtype = compute;
  auto model = MhaModel::Random(spec, 17);
  ASSERT_TRUE(model.ok()) << model.status();
  auto engine = MhaEngine::Create(*model);
  ASSERT_TRUE(engine.ok()) << engine.status();
  uint32_t seed = 1;
  for (const MhaNanCase& c : MhaCases()) RunMhaCase(c, **model, **engine, tol, seed++);
}

TEST(MhaEngineNanTest, NanWhereTorchPutsItFloat32) { RunMhaCases(DType::kFloat32, 1e-5); }

TEST(MhaEngineNanTest, NanWhereTorchPutsItBFloat16Compute) { RunMhaCases(DType::kBFloat16, 2e-2); }

// softmax(q k^T / sqrt(d)) v with q[0][2][1] and v[1][3][5] NaN: row 2 of
// head 0 wholly NaN; feature 5 of every row of head 1 ("..N.. nnnnn").
TEST(SdpaNanTest, NanQueryAndValueWhereTorchPutsThem) {
  std::mt19937 rng(3);
  const int64_t d = 8;
  Tensor q = RandomTensor({1, kH, kL, d}, rng), k = RandomTensor({1, kH, kS, d}, rng),
         v = RandomTensor({1, kH, kS, d}, rng);
  q.mutable_as<float>()[(0 * kL + 2) * d + 1] = kNaN;
  v.mutable_as<float>()[(1 * kS + 3) * d + 5] = kNaN;
  PrimitiveCache cache(16);
  SdpaInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  auto out = ScaledDotProductAttention(in, cache);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Pattern(out->as<float>(), kL, d), "..N..");
  EXPECT_EQ(Pattern(out->as<float>() + kL * d, kL, d), "nnnnn");
  for (int64_t i = 0; i < kL; ++i) {
    for (int64_t f = 0; f < d; ++f) {
      EXPECT_EQ(std::isnan(out->as<float>()[(kL + i) * d + f]), f == 5) << i << " " << f;
    }
  }
}

// Sessions follow PyTorch fed one token at a time with a key/value cache: a
// row never depends on a later token, whatever the chunking.
struct SessionNanCase {
  std::string name;
  std::string expected;
  bool cross = false, causal = false;
  int64_t token = -1;      // tokens[token][3] = NaN (self tokens or cross queries).
  bool not_key = false;    // Self: that token is not a key.
  int64_t key_token = -1;  // Cross: key[key_token][1] = NaN.
  bool nan_kpm = false;    // Cross: an all-NaN float key_padding_mask.
};

class SessionNanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = MhaModel::Random(testing::SelfAttentionSpec(kE, kH), 23);
    ASSERT_TRUE(model.ok()) << model.status();
    auto engine = MhaEngine::Create(*model);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }

  // Appends tokens [0, kL) in chunks of `chunk`; returns the output (kL, E)
  // and each row's weights pattern over the keys it sees.
  std::vector<float> Run(const SessionNanCase& c, const Tensor& x, const Tensor& key, int64_t chunk,
                         std::string* avg, std::string* heads) {
    MemoryBudget budget(size_t{16} << 20);
    SessionEngine sessions(engine_.get(), DType::kFloat32);
    KvBlockPool pool(sessions.block_bytes(), &budget);
    KvCache cache(&pool, kH, kE / kH, DType::kFloat32);
    Tensor not_key(DType::kBool, {kL});
    if (c.not_key) not_key.mutable_as<uint8_t>()[c.token] = 1;
    Tensor kpm(DType::kFloat32, {kS});
    std::fill_n(kpm.mutable_as<float>(), kS, kNaN);
    if (c.cross) {
      CrossKeys keys{key.view(), key.view(), std::nullopt};
      if (c.nan_kpm) keys.key_padding_mask = kpm.view();
      EXPECT_TRUE(sessions.InitCross(keys, &cache).ok());
    }
    std::vector<float> out(kL * kE);
    avg->clear();
    std::vector<std::string> per_head(kH);
    for (int64_t at = 0, k = 0; at < kL; at += chunk, ++k) {
      const int64_t t = std::min(chunk, kL - at);
      SessionStep st;
      st.cache = &cache;
      st.cross = c.cross;
      st.is_causal = c.causal;
      st.position = at;
      st.tokens = TensorView{DType::kFloat32, {t, kE}, x.as<float>() + at * kE};
      if (!c.cross) {
        st.not_key = TensorView{DType::kBool, {t}, not_key.as<uint8_t>() + at};
        EXPECT_TRUE(cache.Reserve(t).ok());
      }
      st.need_weights = true;
      st.average_weights = k % 2 == 0;
      const int64_t columns = sessions.WeightColumns(st);
      std::vector<float> w((st.average_weights ? 1 : kH) * t * columns);
      st.output = out.data() + at * kE;
      st.weights = w.data();
      EXPECT_TRUE(sessions.Run({st}).ok());
      for (int64_t i = 0; i < t; ++i) {
        const int64_t p = at + i;
        const int64_t seen = c.cross ? (c.causal ? std::min(kS, p + 1) : kS) : p + 1;
        if (st.average_weights) {
          *avg += Pattern(w.data() + i * columns, 1, columns, seen);
          continue;
        }
        avg->push_back('?');  // Only per-head weights for this chunk.
        for (int64_t h = 0; h < kH; ++h)
          per_head[h] += Pattern(w.data() + (h * t + i) * columns, 1, columns, seen);
      }
      for (int64_t h = 0; h < kH; ++h) per_head[h].resize(at + t, '?');
    }
    *heads = per_head[0] + " " + per_head[1];
    return out;
  }

  std::unique_ptr<MhaEngine> engine_;
};

// A pattern with the rows marked '?' (not computed in that form) taken from `want`.
std::string Known(std::string got, const std::string& want) {
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (got[i] == '?') got[i] = want[i];
  }
  return got;
}

TEST_F(SessionNanTest, NanWhereTorchDecodingPutsItForEveryChunking) {
  const std::vector<SessionNanCase> cases = {
      {"session_self_nan_token", "..NNN ..NNN ..NNN ..NNN", false, false, 2},
      {"session_self_nan_not_key", "..NNN ..NNN ..NNN ..NNN", false, false, 2, true},
      {"session_cross_nan_query", "..N.. ..N.. ..N.. ..N..", true, false, 2},
      {"session_cross_nan_key_causal", "...NN ...NN ...NN ...NN", true, true, -1, false, 3},
      {"session_cross_nan_float_kpm", "NNNNN NNNNN NNNNN NNNNN", true, false, -1, false, -1, true},
  };
  std::mt19937 rng(29);
  const Tensor clean = RandomTensor({kL, kE}, rng), clean_key = RandomTensor({kS, kE}, rng);
  for (const SessionNanCase& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor x(DType::kFloat32, {kL, kE}), key(DType::kFloat32, {kS, kE});
    std::copy_n(clean.as<float>(), kL * kE, x.mutable_as<float>());
    std::copy_n(clean_key.as<float>(), kS * kE, key.mutable_as<float>());
    if (c.token >= 0) x.mutable_as<float>()[c.token * kE + 3] = kNaN;
    if (c.key_token >= 0) key.mutable_as<float>()[c.key_token * kE + 1] = kNaN;
    const std::vector<std::string> want = Expected(c.expected);
    std::string avg, heads;
    SessionNanCase finite = c;
    finite.nan_kpm = false;
    const std::vector<float> baseline = Run(finite, clean, clean_key, kL, &avg, &heads);
    for (int64_t chunk : {int64_t{5}, int64_t{1}, int64_t{2}, int64_t{3}}) {
      SCOPED_TRACE(chunk);
      const std::vector<float> out = Run(c, x, key, chunk, &avg, &heads);
      const std::string got = Pattern(out.data(), kL, kE);
      EXPECT_EQ(got, want[0]);
      EXPECT_EQ(Known(avg, want[1]), want[1]);
      EXPECT_EQ(Known(heads, want[2] + " " + want[3]), want[2] + " " + want[3]);
      for (int64_t i = 0; i < kL; ++i) {  // Rows before the NaN: as without it.
        if (want[0][i] != '.') continue;
        for (int64_t f = 0; f < kE; ++f) {
          ASSERT_NEAR(out[i * kE + f], baseline[i * kE + f], 1e-5) << "row " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace attention
