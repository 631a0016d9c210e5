// SessionEngine against PyTorch: every case in tests/golden/sessions (written
// by tests/golden/generate_sessions.py) appended all at once, one token at a
// time and in uneven chunks, each compared with the expected rows of one
// stateless MultiheadAttention call over the whole sequence, and with each
// other. Plus batching, weights and the cache's memory.
#include "core/session_engine.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/memory_budget.h"
#include "core/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace attention {
namespace {

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(GOLDEN_SESSIONS_DIR)) {
    if (entry.is_directory()) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Rows [row0, row0 + rows) of a (rows, width) tensor.
TensorView Rows(const Tensor& t, int64_t row0, int64_t rows) {
  const int64_t width = t.num_elements() / t.dim(0);
  return TensorView{t.dtype(),
                    {rows, width},
                    static_cast<const char*>(t.data()) + row0 * width * DTypeSize(t.dtype())};
}

// One appended chunk's results.
struct Chunk {
  int64_t first = 0;  // Position of its first token.
  int64_t tokens = 0;
  int64_t columns = 0;  // Of its weights rows.
  std::vector<float> output, averaged, per_head;
};

struct Case {
  nlohmann::json meta;
  std::unique_ptr<SafeTensors> io;
  std::unique_ptr<MhaEngine> engine;
  double atol = 0, rtol = 0;
  bool cross = false;
  int64_t tokens = 0, heads = 0, e = 0, extra = 0, stored = 0;

  explicit Case(const std::string& name) {
    const std::string dir = std::string(GOLDEN_SESSIONS_DIR) + "/" + name;
    std::ifstream f(dir + "/case.json");
    meta = nlohmann::json::parse(f);
    auto st = SafeTensors::ReadFile(dir + "/io.safetensors");
    EXPECT_TRUE(st.ok()) << st.status();
    io = std::make_unique<SafeTensors>(std::move(*st));
    auto model = MhaModel::LoadFromDirectory(dir);
    EXPECT_TRUE(model.ok()) << model.status();
    auto made = MhaEngine::Create(*model);
    EXPECT_TRUE(made.ok()) << made.status();
    engine = std::move(*made);
    atol = meta["atol"];
    rtol = meta["rtol"];
    cross = meta["kind"] == "cross";
    const Tensor& x = *io->Find(cross ? "query" : "tokens");
    tokens = x.dim(0);
    const MhaSpec& s = engine->model().spec();
    heads = s.num_heads;
    e = s.embed_dim;
    extra = s.extra_keys();
    stored = cross ? io->Find("key")->dim(0) : tokens;
  }

  // Appends the sequence in chunks of the given sizes (cycled), with
  // averaged weights on even chunks and per-head weights on odd ones.
  std::vector<Chunk> Run(const std::vector<int64_t>& sizes, size_t* pool_used = nullptr) {
    MemoryBudget budget(size_t{64} << 20);
    SessionEngine sessions(engine.get(), engine->model().spec().compute_dtype);
    KvBlockPool pool(sessions.block_bytes(), &budget);
    std::vector<Chunk> chunks;
    {
      KvCache cache(&pool, heads, engine->model().spec().head_dim(), sessions.cache_dtype());
      const Tensor* mask = io->Find(cross ? "key_padding_mask" : "not_key");
      if (cross) {
        CrossKeys keys{io->Find("key")->view(), io->Find("value")->view(), std::nullopt};
        if (mask != nullptr) keys.key_padding_mask = mask->view();
        EXPECT_TRUE(sessions.ValidateCross(keys).ok());
        const absl::Status init = sessions.InitCross(keys, &cache);
        EXPECT_TRUE(init.ok()) << init;
      }
      const Tensor& x = *io->Find(cross ? "query" : "tokens");
      for (int64_t at = 0, k = 0; at < tokens; ++k) {
        const int64_t t = std::min(sizes[static_cast<size_t>(k) % sizes.size()], tokens - at);
        Chunk c;
        c.first = at;
        c.tokens = t;
        SessionStep step;
        step.cache = &cache;
        step.cross = cross;
        step.is_causal = cross && meta["is_causal"].get<bool>();
        step.position = at;
        step.tokens = Rows(x, at, t);
        if (!cross && mask != nullptr) {
          step.not_key = TensorView{DType::kBool, {t}, mask->as<bool>() + at};
        }
        EXPECT_TRUE(sessions.ValidateStep(cross, step.tokens, step.not_key).ok());
        if (!cross) {
          EXPECT_TRUE(cache.Reserve(t).ok());
        }
        step.need_weights = true;
        step.average_weights = k % 2 == 0;
        c.columns = sessions.WeightColumns(step);
        c.output.resize(static_cast<size_t>(t * e));
        std::vector<float>& w = step.average_weights ? c.averaged : c.per_head;
        w.resize(static_cast<size_t>((step.average_weights ? 1 : heads) * t * c.columns));
        step.output = c.output.data();
        step.weights = w.data();
        const absl::Status status = sessions.Run({step});
        EXPECT_TRUE(status.ok()) << status;
        at += t;
        chunks.push_back(std::move(c));
      }
      EXPECT_EQ(cache.length(), stored);
      if (pool_used != nullptr) *pool_used = pool.used_bytes();
    }
    EXPECT_EQ(pool.used_bytes(), 0u);
    EXPECT_EQ(pool.mapped_bytes(), 0u);
    EXPECT_EQ(budget.used(), 0u);
    return chunks;
  }

  bool Close(double actual, double expected) const {
    return std::abs(actual - expected) <= atol + rtol * std::abs(expected);
  }

  // Compares every chunk with the expected rows; returns the mismatches.
  int64_t Check(const std::vector<Chunk>& chunks) const {
    const float* out = io->Find("expected_output")->as<float>();
    const float* avg = io->Find("expected_attn_weights")->as<float>();
    const float* per_head = io->Find("expected_attn_weights_per_head")->as<float>();
    const int64_t full = stored + extra;  // Columns of the expected weights.
    int64_t bad = 0;
    for (const Chunk& c : chunks) {
      const int64_t seen = c.columns - extra;  // Stored tokens at the chunk's end.
      for (int64_t i = 0; i < c.tokens; ++i) {
        const int64_t p = c.first + i;
        for (int64_t j = 0; j < e; ++j) bad += !Close(c.output[i * e + j], out[p * e + j]);
        for (int64_t h = 0; h < (c.averaged.empty() ? heads : 1); ++h) {
          const float* got = c.averaged.empty() ? &c.per_head[(h * c.tokens + i) * c.columns]
                                                : &c.averaged[i * c.columns];
          const float* want =
              c.averaged.empty() ? &per_head[(h * tokens + p) * full] : &avg[p * full];
          for (int64_t j = 0; j < seen; ++j) bad += !Close(got[j], want[j]);
          for (int64_t j = seen; j < stored; ++j) bad += want[j] != 0.0f;
          for (int64_t j = 0; j < extra; ++j) bad += !Close(got[seen + j], want[stored + j]);
        }
      }
    }
    return bad;
  }
};

class SessionGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SessionGoldenTest, EveryChunkingMatchesPyTorchAndTheOthers) {
  Case c(GetParam());
  SCOPED_TRACE(c.meta["description"].get<std::string>());
  const std::vector<Chunk> whole = c.Run({c.tokens});
  const std::vector<Chunk> single = c.Run({1});
  const std::vector<Chunk> uneven = c.Run({3, 1, 7, 16, 2});
  EXPECT_EQ(c.Check(whole), 0) << "all at once";
  EXPECT_EQ(c.Check(single), 0) << "one token at a time";
  EXPECT_EQ(c.Check(uneven), 0) << "uneven chunks";
  // The chunkings agree with each other far closer than with PyTorch.
  auto flat = [](const std::vector<Chunk>& chunks) {
    std::vector<float> all;
    for (const Chunk& ch : chunks) all.insert(all.end(), ch.output.begin(), ch.output.end());
    return all;
  };
  const std::vector<float> a = flat(whole), b = flat(single), u = flat(uneven);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), u.size());
  const double tol = c.meta["compute_dtype"] == "bfloat16" ? 1e-2 : 1e-6;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], tol) << "element " << i;
    ASSERT_NEAR(a[i], u[i], tol) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Sessions, SessionGoldenTest, ::testing::ValuesIn(CaseNames()),
                         [](const auto& info) { return info.param; });

TEST(SessionGoldenSuiteTest, HasTheCases) { EXPECT_GE(CaseNames().size(), 12u); }

// Three sessions (two self, one cross) stepped together in one Run give what
// each gives alone: the batch only shares the projections' GEMMs.
TEST(SessionEngineTest, BatchedStepsEqualSoloSteps) {
  Case self_case("self_heads_8");
  const MhaEngine& engine = *self_case.engine;
  const int64_t e = self_case.e;
  MemoryBudget budget(size_t{16} << 20);
  SessionEngine sessions(&engine, DType::kFloat32);
  KvBlockPool pool(sessions.block_bytes(), &budget);
  const Tensor& x = *self_case.io->Find("tokens");  // (40, 64)
  // Cross keys: the same tokens, as kdim == vdim == E.
  CrossKeys keys{Rows(x, 0, 23), Rows(x, 5, 23), std::nullopt};
  auto run = [&](bool together) {
    std::vector<std::unique_ptr<KvCache>> caches;
    for (int i = 0; i < 3; ++i) {
      caches.push_back(std::make_unique<KvCache>(&pool, 8, 8, DType::kFloat32));
    }
    EXPECT_TRUE(sessions.InitCross(keys, caches[2].get()).ok());
    // Prefill the self sessions to different lengths.
    for (int i = 0; i < 2; ++i) {
      SessionStep prefill;
      prefill.cache = caches[i].get();
      prefill.tokens = Rows(x, 0, 9 + 14 * i);
      std::vector<float> out(static_cast<size_t>(prefill.tokens.dim(0) * e));
      prefill.output = out.data();
      EXPECT_TRUE(caches[i]->Reserve(prefill.tokens.dim(0)).ok());
      EXPECT_TRUE(sessions.Run({prefill}).ok());
    }
    std::vector<std::vector<float>> outputs(3), weights(3);
    std::vector<SessionStep> steps(3);
    const int64_t sizes[3] = {1, 5, 3};
    for (int i = 0; i < 3; ++i) {
      SessionStep& st = steps[i];
      st.cache = caches[i].get();
      st.cross = i == 2;
      st.is_causal = st.cross;
      st.position = 4;
      st.tokens = Rows(x, 30 + i, sizes[i]);
      st.need_weights = true;
      st.average_weights = i != 1;
      if (!st.cross) {
        EXPECT_TRUE(st.cache->Reserve(sizes[i]).ok());
      }
      outputs[i].resize(static_cast<size_t>(sizes[i] * e));
      weights[i].resize(static_cast<size_t>((st.average_weights ? 1 : 8) * sizes[i] *
                                            sessions.WeightColumns(st)));
      st.output = outputs[i].data();
      st.weights = weights[i].data();
    }
    if (together) {
      EXPECT_TRUE(sessions.Run(steps).ok());
    } else {
      for (const SessionStep& st : steps) EXPECT_TRUE(sessions.Run({st}).ok());
    }
    EXPECT_EQ(caches[0]->length(), 10);
    EXPECT_EQ(caches[1]->length(), 28);
    std::vector<float> all;
    for (int i = 0; i < 3; ++i) {
      all.insert(all.end(), outputs[i].begin(), outputs[i].end());
      all.insert(all.end(), weights[i].begin(), weights[i].end());
    }
    return all;
  };
  const std::vector<float> together = run(true), alone = run(false);
  ASSERT_EQ(together.size(), alone.size());
  for (size_t i = 0; i < together.size(); ++i) ASSERT_NEAR(together[i], alone[i], 1e-6) << i;
  EXPECT_EQ(pool.used_bytes(), 0u);
}

// A float32 model's cache kept in bfloat16 (session_cache_dtype): half the
// memory, within bfloat16's rounding of PyTorch.
TEST(SessionEngineTest, Bfloat16CacheOfAFloat32ModelIsApproximate) {
  Case c("self_not_key");
  MemoryBudget budget(size_t{16} << 20);
  SessionEngine f32(c.engine.get(), DType::kFloat32), bf16(c.engine.get(), DType::kBFloat16);
  EXPECT_EQ(bf16.block_bytes() * 2, f32.block_bytes());
  KvBlockPool pool(bf16.block_bytes(), &budget);
  KvCache cache(&pool, c.heads, c.e / c.heads, DType::kBFloat16);
  const Tensor& x = *c.io->Find("tokens");
  const Tensor& not_key = *c.io->Find("not_key");
  SessionStep step;
  step.cache = &cache;
  step.tokens = x.view();
  step.not_key = not_key.view();
  std::vector<float> out(static_cast<size_t>(x.num_elements()));
  step.output = out.data();
  ASSERT_TRUE(cache.Reserve(c.tokens).ok());
  ASSERT_TRUE(bf16.Run({step}).ok());
  const float* want = c.io->Find("expected_output")->as<float>();
  double worst = 0;
  for (size_t i = 0; i < out.size(); ++i)
    worst = std::max(worst, std::abs(double(out[i]) - want[i]));
  EXPECT_LT(worst, 2e-2);
  EXPECT_GT(worst, 1e-6);  // Really rounded: not the float32 path.
}

TEST(KvBlockPoolTest, BudgetIsAllOrNothingAndMemoryGoesBack) {
  const size_t block = KvCache::BlockBytes(8, 32, DType::kFloat32);  // 32 KiB.
  MemoryBudget budget(size_t{4} << 20);                              // 4 slabs of 1 MiB.
  KvBlockPool pool(block, &budget);
  std::vector<void*> blocks;
  ASSERT_TRUE(pool.Allocate(100, &blocks).ok());
  EXPECT_EQ(blocks.size(), 100u);
  EXPECT_EQ(pool.used_bytes(), 100 * block);
  // 28 blocks remain in the mapped slabs; 29 would need a fifth slab.
  const absl::Status over = pool.Allocate(29, &blocks);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find("session memory budget"), absl::string_view::npos) << over;
  EXPECT_EQ(blocks.size(), 100u);  // Nothing taken.
  ASSERT_TRUE(pool.Allocate(28, &blocks).ok());
  EXPECT_EQ(budget.used(), budget.capacity());
  pool.Free(blocks.data(), blocks.size());
  EXPECT_EQ(pool.used_bytes(), 0u);
  EXPECT_EQ(pool.mapped_bytes(), 0u);  // Every slab unmapped again.
  EXPECT_EQ(budget.used(), 0u);
}

TEST(KvCacheTest, ReserveFailureLeavesTheSessionAsItWas) {
  MemoryBudget budget(size_t{1} << 20);  // One slab: 32 blocks of 32 KiB, 512 tokens.
  KvBlockPool pool(KvCache::BlockBytes(8, 32, DType::kFloat32), &budget);
  KvCache cache(&pool, 8, 32, DType::kFloat32);
  ASSERT_TRUE(cache.Reserve(500).ok());
  std::vector<float> k(256, 1.0f), v(256, 2.0f);
  for (int64_t p = 0; p < 500; ++p) cache.Store(p, k.data(), v.data(), 0.0f);
  cache.Commit(500);
  EXPECT_EQ(cache.Reserve(100).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache.length(), 500);
  EXPECT_EQ(cache.capacity(), 512);
  EXPECT_TRUE(cache.Reserve(12).ok());
}

}  // namespace
}  // namespace attention
