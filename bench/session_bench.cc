// attention-session-bench: how fast a batched decode step reads the session
// caches. N sessions of C tokens each (a model of E features, H heads) take
// one token each; the benchmark times
//   * the attention phase of the step alone (every session x head row scored
//     against its cache and summed over its values, as SessionEngine::Run
//     does it), and the bytes of cache it reads (K and V of every token);
//   * the whole step (SessionEngine::Run: projections, attention, output);
//   * this machine's single-thread copy bandwidth (memcpy of a buffer far
//     larger than the caches), in the same run;
// and prints the attention phase's read bandwidth as a share of the copy
// bandwidth.
//
//   attention-session-bench --sessions 64 --context 2048 --embed_dim 512 --num_heads 8
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "core/memory_budget.h"
#include "core/mha_engine.h"
#include "core/session_engine.h"
#include "core/session_kernel.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int64_t, sessions, 64, "Sessions stepping together.");
ABSL_FLAG(int64_t, context, 2048, "Tokens each session holds before the step.");
ABSL_FLAG(int64_t, embed_dim, 512, "E.");
ABSL_FLAG(int64_t, num_heads, 8, "H.");
ABSL_FLAG(std::string, cache_dtype, "float32", "float32 or bfloat16.");
ABSL_FLAG(int, iterations, 20, "Timed steps (the median is reported).");
ABSL_FLAG(bool, json, false, "Print one JSON object.");

namespace attention {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Single-thread memcpy bandwidth (bytes read per second) over `bytes`.
double CopyBandwidth(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> rates;
  for (int i = 0; i < 5; ++i) {
    const absl::Time start = absl::Now();
    std::memcpy(b.data(), a.data(), bytes);
    rates.push_back(static_cast<double>(bytes) / absl::ToDoubleSeconds(absl::Now() - start));
    std::swap(a, b);
  }
  return Median(rates);
}

int Run() {
  const int64_t n = absl::GetFlag(FLAGS_sessions), c = absl::GetFlag(FLAGS_context);
  const int64_t e = absl::GetFlag(FLAGS_embed_dim), h = absl::GetFlag(FLAGS_num_heads);
  const DType dtype =
      absl::GetFlag(FLAGS_cache_dtype) == "bfloat16" ? DType::kBFloat16 : DType::kFloat32;
  MhaSpec spec;
  spec.embed_dim = spec.kdim = spec.vdim = e;
  spec.num_heads = h;
  auto model = MhaModel::Random(spec, 1);
  auto engine = MhaEngine::Create(*model);
  if (!model.ok() || !engine.ok()) return 1;
  SessionEngine sessions(engine->get(), dtype);
  MemoryBudget budget(size_t{64} << 30);
  KvBlockPool pool(sessions.block_bytes(), &budget);
  std::vector<std::unique_ptr<KvCache>> caches;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(512 * e));
  for (float& v : x) v = normal(rng);
  // Prefill every session with C tokens (chunks of 512).
  for (int64_t s = 0; s < n; ++s) {
    caches.push_back(std::make_unique<KvCache>(&pool, h, e / h, dtype));
    for (int64_t at = 0; at < c; at += 512) {
      const int64_t t = std::min<int64_t>(512, c - at);
      std::vector<float> out(static_cast<size_t>(t * e));
      SessionStep step;
      step.cache = caches.back().get();
      step.tokens = TensorView{DType::kFloat32, {t, e}, x.data()};
      step.output = out.data();
      if (!step.cache->Reserve(t).ok() || !sessions.Run({step}).ok()) return 1;
    }
  }
  // The attention phase of a one-token step: every session x head row.
  const int64_t d = e / h;
  std::vector<float> q(static_cast<size_t>(n * e)), context(static_cast<size_t>(n * e));
  for (float& v : q) v = normal(rng) * 0.1f;
  const double bytes_read =
      static_cast<double>(n) * static_cast<double>(c) * 2.0 * e * DTypeSize(dtype);
  std::vector<double> attention_s, step_s;
  for (int i = 0; i < absl::GetFlag(FLAGS_iterations) + 2; ++i) {
    const absl::Time start = absl::Now();
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < n * h; ++task) {
      SessionRow row;
      row.cache = caches[task / h].get();
      row.head = task % h;
      row.keys = row.stored = c;
      row.q = q.data() + (task / h) * e + row.head * d;
      row.context = context.data() + (task / h) * e + row.head * d;
      AttendSessionRow(row);
    }
    if (i >= 2) attention_s.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  // Whole steps (they grow the caches by one token each).
  for (int i = 0; i < absl::GetFlag(FLAGS_iterations) + 2; ++i) {
    std::vector<SessionStep> steps(static_cast<size_t>(n));
    std::vector<float> out(static_cast<size_t>(n * e));
    for (int64_t s = 0; s < n; ++s) {
      steps[s].cache = caches[s].get();
      steps[s].tokens = TensorView{DType::kFloat32, {1, e}, x.data() + s * e};
      steps[s].output = out.data() + s * e;
      if (!caches[s]->Reserve(1).ok()) return 1;
    }
    const absl::Time start = absl::Now();
    if (!sessions.Run(steps).ok()) return 1;
    if (i >= 2) step_s.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  const double copy = CopyBandwidth(std::max<size_t>(size_t{1} << 30, 2 * budget.used()));
  const double attention = Median(attention_s), step = Median(step_s);
  const double rate = bytes_read / attention;
  nlohmann::json j = {{"sessions", n},
                      {"context", c},
                      {"embed_dim", e},
                      {"num_heads", h},
                      {"cache_dtype", std::string(DTypeName(dtype))},
                      {"threads", omp_get_max_threads()},
                      {"cache_bytes_read", bytes_read},
                      {"attention_ms", attention * 1e3},
                      {"step_ms", step * 1e3},
                      {"attention_read_gb_s", rate / 1e9},
                      {"copy_gb_s_single_thread", copy / 1e9},
                      {"share_of_copy_bandwidth", rate / copy}};
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%lld sessions x %lld tokens (E=%lld, H=%lld, %s cache, %d threads)\n",
                static_cast<long long>(n), static_cast<long long>(c), static_cast<long long>(e),
                static_cast<long long>(h), std::string(DTypeName(dtype)).c_str(),
                omp_get_max_threads());
    std::printf("attention phase of a step: %.3f ms, reading %.1f MB of cache: %.2f GB/s\n",
                attention * 1e3, bytes_read / 1e6, rate / 1e9);
    std::printf("whole step (projections + attention + out-projection): %.3f ms, %.0f tokens/s\n",
                step * 1e3, static_cast<double>(n) / step);
    std::printf(
        "single-thread copy bandwidth: %.2f GB/s; the attention phase reads at %.0f%% of it\n",
        copy / 1e9, 100 * rate / copy);
  }
  return 0;
}

}  // namespace
}  // namespace attention

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times a batched decode step over session caches: attention-session-bench [--flags]; see "
      "--help.");
  absl::FlagsUsageConfig usage;  // --help lists this binary's own flags.
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "session_bench.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] {
    return std::string("attention-session-bench " ATTENTION_VERSION "\n");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  return attention::Run();
}
