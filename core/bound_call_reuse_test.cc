// MhaEngine::Linear's per-thread bound calls (core/bound_call.h) where they
// meet the rest of the engine: K and V projections of other widths (kdim,
// vdim != E) written into strided blocks (bias_kv, add_zero_attn), row
// counts that change from call to call (the sessions' Project path), OpenMP
// thread counts that change on one thread (the batcher's 1 or N), a primitive
// cache so small that every call evicts what another needs, threads sharing
// an engine, and engines destroyed and remade while threads keep entries.
// Every output against the double-precision reference (1e-5 relative + 1e-6
// absolute, float32).
#include <omp.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "core/bound_call.h"
#include "core/mha_engine.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::testing::MaxExcess;
using ::attention::testing::RandomTensor;
using ::attention::testing::ReferenceMha;

MhaSpec CrossSpec(bool bias, bool bias_kv, bool zero_attn) {
  MhaSpec spec = testing::SelfAttentionSpec(32, 4);
  spec.kdim = 24;
  spec.vdim = 40;
  spec.bias = bias;
  spec.add_bias_kv = bias_kv;
  spec.add_zero_attn = zero_attn;
  return spec;
}

// One Forward of `engine` on fresh inputs of (n, l, s) against the reference.
void CheckForward(const MhaEngine& engine, const MhaModel& model, int64_t n, int64_t l, int64_t s,
                  std::mt19937& rng) {
  const MhaSpec& spec = model.spec();
  Tensor q = RandomTensor({n, l, spec.embed_dim}, rng);
  Tensor k = RandomTensor({n, s, spec.kdim}, rng);
  Tensor v = RandomTensor({n, s, spec.vdim}, rng);
  MhaInputs in;
  in.query = q.view();
  if (!spec.packed_in_proj() || s != l) {
    in.key = k.view();
    in.value = v.view();
  }
  auto out = engine.Forward(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_LE(MaxExcess(out->output.as<float>(), ReferenceMha(model, in).output, 1e-5), 1e-6)
      << "n " << n << " l " << l << " s " << s;
}

// y = x W^T + b for MhaEngine::Project(kKey) in double.
std::vector<double> KeyProjection(const MhaModel& model, const Tensor& x) {
  const MhaSpec& spec = model.spec();
  const int64_t rows = x.dim(0), e = spec.embed_dim, in = spec.kdim;
  std::vector<double> y(static_cast<size_t>(rows * e));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < e; ++o) {
      double acc = spec.bias ? model.weights().in_bias.as<float>()[e + o] : 0.0;
      for (int64_t i = 0; i < in; ++i) {
        acc += double{x.as<float>()[r * in + i]} * model.weights().k_weight.as<float>()[o * in + i];
      }
      y[r * e + o] = acc;
    }
  }
  return y;
}

// On one thread: K/V widths other than E with appended keys (strided
// destination blocks), every batch and length combination cycling through
// more keys than the thread's entries, the OpenMP thread count flipping
// between calls, Project with a new row count each time in between, and a
// primitive cache of 2 (each call's primitives evict the previous ones).
TEST(BoundCallReuseTest, ShapesThreadCountsAndEvictionsOnOneThread) {
  const int saved_threads = omp_get_max_threads();
  std::mt19937 rng(21);
  for (size_t capacity : {size_t{2}, size_t{512}}) {
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE(::testing::Message() << "capacity " << capacity << " variant " << variant);
      auto model =
          MhaModel::Random(CrossSpec(variant != 1, variant & 1, variant & 2), 30 + variant);
      ASSERT_TRUE(model.ok()) << model.status();
      EngineOptions options;
      options.primitive_cache_capacity = capacity;
      auto engine = MhaEngine::Create(*model, options);
      ASSERT_TRUE(engine.ok()) << engine.status();
      int step = 0;
      for (int round = 0; round < 2; ++round) {
        for (int64_t n : {1, 3}) {
          for (int64_t l : {1, 7, 33}) {
            for (int64_t s : {1, 9, 40}) {
              omp_set_num_threads(step++ % 2 == 0 ? 1 : 2);
              CheckForward(**engine, **model, n, l, s, rng);
              const int64_t rows = 1 + step % 11;
              Tensor x = RandomTensor({rows, (*model)->spec().kdim}, rng);
              std::vector<float> y(static_cast<size_t>(rows * (*model)->spec().embed_dim));
              ASSERT_TRUE((*engine)->Project(MhaEngine::Part::kKey, x.view(), y.data()).ok());
              EXPECT_LE(MaxExcess(y.data(), KeyProjection(**model, x), 1e-5), 1e-6)
                  << "Project rows " << rows;
            }
          }
        }
      }
    }
  }
  omp_set_num_threads(saved_threads);
}

// Three threads share an engine whose primitive cache holds 1 primitive:
// each call's primitives are evicted by the others' while it runs (the
// bound call holds its primitive during the call). Self-attention (the fused
// q/k/v projection) and cross with appended keys.
TEST(BoundCallReuseTest, ThreadsSharingAnEngineWithACacheOfOne) {
  for (bool cross : {false, true}) {
    MhaSpec spec = cross ? CrossSpec(true, true, true) : testing::SelfAttentionSpec(32, 4);
    auto model = MhaModel::Random(spec, 40);
    ASSERT_TRUE(model.ok());
    EngineOptions options;
    options.primitive_cache_capacity = 1;
    auto engine = MhaEngine::Create(*model, options);
    ASSERT_TRUE(engine.ok());
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(static_cast<uint32_t>(50 + t));
        for (int i = 0; i < 12; ++i) {
          CheckForward(**engine, **model, 1 + (i + t) % 2, 1 + 5 * ((i + t) % 4), 1 + 7 * (i % 3),
                       rng);
        }
      });
    }
    for (auto& th : threads) th.join();
  }
}

// A worker thread keeps its entries while the main thread destroys the
// engine it used and makes another (same spec, new weights: the allocator
// may hand out the same addresses) between the worker's calls; the worker
// then computes with the new engine's weights, every time.
TEST(BoundCallReuseTest, EngineRemadeBetweenAWorkersCalls) {
  MhaSpec spec = CrossSpec(true, false, true);
  std::shared_ptr<const MhaModel> model;
  std::unique_ptr<MhaEngine> engine;
  std::atomic<int> turn{0};  // Even: main's turn to remake; odd: the worker's to run.
  std::thread worker([&] {
    std::mt19937 rng(60);
    for (int i = 0; i < 6; ++i) {
      while (turn.load() != 2 * i + 1) std::this_thread::yield();
      CheckForward(*engine, *model, 2, 5, 6, rng);
      CheckForward(*engine, *model, 1, 3, 3, rng);
      turn.store(2 * i + 2);
    }
  });
  for (int i = 0; i < 6; ++i) {
    while (turn.load() != 2 * i) std::this_thread::yield();
    engine.reset();
    model.reset();
    auto m = MhaModel::Random(spec, 70 + static_cast<uint64_t>(i));
    ASSERT_TRUE(m.ok());
    model = *m;
    auto e = MhaEngine::Create(model);
    ASSERT_TRUE(e.ok());
    engine = std::move(*e);
    turn.store(2 * i + 1);
  }
  worker.join();
}

}  // namespace
}  // namespace attention
