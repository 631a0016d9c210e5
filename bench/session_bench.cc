// attention-session-bench: how fast a batched decode step reads the session
// caches. N sessions of C tokens each (a model of E features, H heads) take
// one token each; for each attention kernel asked for (--kernel: the
// reference AttendSessionRow per head, the AVX-512 decode kernel, or both,
// alternated in this process), the benchmark times
//   * the attention phase of the step alone (session_attention.h's
//     AttendRows over the N rows), and the bytes of cache it reads (K and V
//     of every token, every head);
//   * the whole step (SessionEngine::Run: projections, attention,
//     out-projection; not committed, so every step sees the same caches);
// and, in the same rounds, a STREAM-like triad a[i] = b[i] + s c[i] on the
// run's OpenMP threads over arrays far larger than the caches (12 bytes per
// element, the best of 5), and prints the cache's read bandwidth as a share
// of it. --interleave prefills the sessions round-robin, a block at a time,
// so that each session's blocks lie apart as in a server.
//
//   attention-session-bench --sessions 64 --context 2048 --embed_dim 256 --num_heads 8 --json
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/memory_budget.h"
#include "core/mha_engine.h"
#include "core/session_attention.h"
#include "core/session_decode.h"
#include "core/session_engine.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int64_t, sessions, 64, "Sessions stepping together.");
ABSL_FLAG(int64_t, context, 2048, "Tokens each session holds before the step.");
ABSL_FLAG(int64_t, embed_dim, 512, "E.");
ABSL_FLAG(int64_t, num_heads, 8, "H.");
ABSL_FLAG(std::string, cache_dtype, "float32", "float32 or bfloat16.");
ABSL_FLAG(std::string, kernel, "both", "reference, decode, or both (alternated).");
ABSL_FLAG(int, iterations, 20, "Timed steps per round and kernel (the median is reported).");
ABSL_FLAG(int, rounds, 3, "Rounds: each times the triad, then every kernel.");
ABSL_FLAG(bool, triad, true, "Measure the triad bandwidth each round.");
ABSL_FLAG(int64_t, triad_mib, 256, "MiB per triad array (three arrays).");
ABSL_FLAG(bool, interleave, false, "Prefill round-robin, one block per session at a time.");
ABSL_FLAG(std::string, decode_prefetch, "",
          "Comma-separated planes:hint software-prefetch settings of the decode kernel, each timed "
          "as a kernel of its own (session_decode.h's DecodePrefetch); empty: the default.");
ABSL_FLAG(bool, json, false, "Print one JSON object.");

namespace attention {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A STREAM-like triad on the OpenMP threads: bytes (12 per element) per
// second, the best of 5.
class Triad {
 public:
  explicit Triad(int64_t n) : n_(n), a_(new float[n]), b_(new float[n]), c_(new float[n]) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n_; ++i) {  // First touch by the thread that uses the page.
      a_[i] = 0.0f;
      b_[i] = 1.0f;
      c_[i] = 2.0f;
    }
  }
  double BytesPerSecond() {
    double best = 0;
    float* a = a_.get();
    const float* b = b_.get();
    const float* c = c_.get();
    const float s = 0.5f;
    for (int rep = 0; rep < 5; ++rep) {
      const absl::Time start = absl::Now();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n_; ++i) a[i] = b[i] + s * c[i];
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      best = std::max(best, 12.0 * static_cast<double>(n_) / seconds);
    }
    return best;
  }

 private:
  const int64_t n_;
  std::unique_ptr<float[]> a_, b_, c_;
};

int Run() {
  const int64_t n = absl::GetFlag(FLAGS_sessions), c = absl::GetFlag(FLAGS_context);
  const int64_t e = absl::GetFlag(FLAGS_embed_dim), h = absl::GetFlag(FLAGS_num_heads);
  const int iterations = std::max(1, absl::GetFlag(FLAGS_iterations));
  const DType dtype =
      absl::GetFlag(FLAGS_cache_dtype) == "bfloat16" ? DType::kBFloat16 : DType::kFloat32;
  struct Kernel {
    std::string name;
    SessionKernel kernel;
    std::optional<DecodePrefetch> prefetch;  // The decode kernel's, if set.
  };
  std::vector<Kernel> kernels;
  const std::string which = absl::GetFlag(FLAGS_kernel);
  if (which == "reference" || which == "both") {
    kernels.push_back({"reference", SessionKernel::kReference, std::nullopt});
  }
  if (which == "decode" || which == "both") {
    const std::string prefetch = absl::GetFlag(FLAGS_decode_prefetch);
    if (prefetch.empty()) kernels.push_back({"decode", SessionKernel::kDecode, std::nullopt});
    for (absl::string_view setting : absl::StrSplit(prefetch, ',', absl::SkipEmpty())) {
      const std::pair<absl::string_view, absl::string_view> ph = absl::StrSplit(setting, ':');
      DecodePrefetch pf;
      if (!absl::SimpleAtoi(ph.first, &pf.planes) || !absl::SimpleAtoi(ph.second, &pf.hint)) {
        std::fprintf(stderr, "--decode_prefetch: expected planes:hint, got %s\n",
                     std::string(setting).c_str());
        return 2;
      }
      kernels.push_back(
          {absl::StrCat("decode_pf", ph.first, ":", ph.second), SessionKernel::kDecode, pf});
    }
  }
  if (kernels.empty()) {
    std::fprintf(stderr, "--kernel: expected reference, decode or both, got %s\n", which.c_str());
    return 2;
  }
  MhaSpec spec;
  spec.embed_dim = spec.kdim = spec.vdim = e;
  spec.num_heads = h;
  auto model = MhaModel::Random(spec, 1);
  auto engine = MhaEngine::Create(*model);
  if (!model.ok() || !engine.ok()) return 1;
  std::vector<std::unique_ptr<SessionEngine>> engines;
  for (const Kernel& k : kernels) {
    engines.push_back(std::make_unique<SessionEngine>(engine->get(), dtype, k.kernel));
  }
  const DecodePrefetch default_prefetch = GetDecodePrefetch();
  MemoryBudget budget(size_t{64} << 30);
  KvBlockPool pool(engines[0]->block_bytes(), &budget);
  std::vector<std::unique_ptr<KvCache>> caches;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(512 * e));
  for (float& v : x) v = normal(rng);
  for (int64_t s = 0; s < n; ++s)
    caches.push_back(std::make_unique<KvCache>(&pool, h, e / h, dtype));
  // Prefill every session with C tokens: chunks of 512 a session at a time,
  // or (--interleave) one block of every session per step.
  const int64_t chunk = absl::GetFlag(FLAGS_interleave) ? KvCache::kBlockTokens : 512;
  for (int64_t at = 0; at < c; at += chunk) {
    const int64_t t = std::min(chunk, c - at);
    std::vector<float> out(static_cast<size_t>(n * t * e));
    std::vector<SessionStep> steps(static_cast<size_t>(n));
    for (int64_t s = 0; s < n; ++s) {
      SessionStep& step = steps[static_cast<size_t>(s)];
      step.cache = caches[static_cast<size_t>(s)].get();
      step.tokens = TensorView{DType::kFloat32, {t, e}, x.data()};
      step.output = out.data() + s * t * e;
      if (!step.cache->Reserve(t).ok()) return 1;
      if (!absl::GetFlag(FLAGS_interleave) && !engines[0]->Run({step}).ok()) return 1;
    }
    if (absl::GetFlag(FLAGS_interleave) && !engines[0]->Run(steps).ok()) return 1;
  }
  // The attention phase's rows, and the whole step's (room for its token).
  std::vector<float> q(static_cast<size_t>(n * e)), context(static_cast<size_t>(n * e));
  for (float& v : q) v = normal(rng) * 0.1f;
  std::vector<AttentionRow> rows(static_cast<size_t>(n));
  std::vector<SessionStep> steps(static_cast<size_t>(n));
  std::vector<float> out(static_cast<size_t>(n * e));
  for (int64_t s = 0; s < n; ++s) {
    AttentionRow& row = rows[static_cast<size_t>(s)];
    row.cache = caches[static_cast<size_t>(s)].get();
    row.keys = row.stored = c;
    row.q = q.data() + s * e;
    row.context = context.data() + s * e;
    SessionStep& step = steps[static_cast<size_t>(s)];
    step.cache = caches[static_cast<size_t>(s)].get();
    step.tokens = TensorView{DType::kFloat32, {1, e}, x.data() + s * e};
    step.output = out.data() + s * e;
    if (!step.cache->Reserve(1).ok()) return 1;
  }
  const double bytes_read =
      static_cast<double>(n) * static_cast<double>(c) * 2.0 * e * DTypeSize(dtype);
  std::unique_ptr<Triad> triad;
  if (absl::GetFlag(FLAGS_triad)) {
    triad = std::make_unique<Triad>(absl::GetFlag(FLAGS_triad_mib) << 18);
  }
  nlohmann::json runs = nlohmann::json::array();
  std::vector<std::vector<double>> attention_all(kernels.size()), step_all(kernels.size());
  std::vector<double> triads;
  for (int round = 0; round < std::max(1, absl::GetFlag(FLAGS_rounds)); ++round) {
    const double triad_bw = triad ? triad->BytesPerSecond() : 0.0;
    if (triad) triads.push_back(triad_bw);
    for (size_t k = 0; k < kernels.size(); ++k) {
      SetDecodePrefetch(kernels[k].prefetch.value_or(default_prefetch));
      std::vector<double> attention_s, step_s;
      for (int i = 0; i < iterations + 2; ++i) {
        const absl::Time start = absl::Now();
        AttendRows(rows, AttentionExtras{}, kernels[k].kernel);
        if (i >= 2) attention_s.push_back(absl::ToDoubleSeconds(absl::Now() - start));
      }
      for (int i = 0; i < iterations + 2; ++i) {
        const absl::Time start = absl::Now();
        if (!engines[k]->Run(steps, /*commit=*/false).ok()) return 1;
        if (i >= 2) step_s.push_back(absl::ToDoubleSeconds(absl::Now() - start));
      }
      const double attention = Median(attention_s), step = Median(step_s);
      attention_all[k].push_back(attention);
      step_all[k].push_back(step);
      nlohmann::json r = {{"round", round},
                          {"kernel", kernels[k].name},
                          {"attention_ms", attention * 1e3},
                          {"attention_kv_gb_s", bytes_read / attention / 1e9},
                          {"step_ms", step * 1e3},
                          {"tokens_per_s", static_cast<double>(n) / step},
                          {"step_kv_gb_s", bytes_read / step / 1e9}};
      if (triad) {
        r["triad_gb_s"] = triad_bw / 1e9;
        r["attention_share_of_triad"] = bytes_read / attention / triad_bw;
        r["step_share_of_triad"] = bytes_read / step / triad_bw;
      }
      runs.push_back(r);
    }
  }
  nlohmann::json j = {{"sessions", n},
                      {"context", c},
                      {"embed_dim", e},
                      {"num_heads", h},
                      {"cache_dtype", std::string(DTypeName(dtype))},
                      {"interleave", absl::GetFlag(FLAGS_interleave)},
                      {"threads", omp_get_max_threads()},
                      {"cache_bytes_read", bytes_read},
                      {"runs", runs}};
  if (triad) j["triad_gb_s_median"] = Median(triads) / 1e9;
  for (size_t k = 0; k < kernels.size(); ++k) {
    const double attention = Median(attention_all[k]), step = Median(step_all[k]);
    nlohmann::json m = {{"attention_ms", attention * 1e3},
                        {"attention_kv_gb_s", bytes_read / attention / 1e9},
                        {"step_ms", step * 1e3},
                        {"tokens_per_s", static_cast<double>(n) / step},
                        {"step_kv_gb_s", bytes_read / step / 1e9}};
    if (triad) {
      m["attention_share_of_triad"] = bytes_read / attention / Median(triads);
      m["step_share_of_triad"] = bytes_read / step / Median(triads);
    }
    j["median"][kernels[k].name] = m;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%lld sessions x %lld tokens (E=%lld, H=%lld, %s cache, %d threads): %.1f MB read\n",
              static_cast<long long>(n), static_cast<long long>(c), static_cast<long long>(e),
              static_cast<long long>(h), std::string(DTypeName(dtype)).c_str(),
              omp_get_max_threads(), bytes_read / 1e6);
  for (const nlohmann::json& r : runs) {
    std::printf(
        "round %d %-14s attention %7.3f ms %6.2f GB/s | step %7.3f ms %7.0f tokens/s %6.2f GB/s",
        r["round"].get<int>(), r["kernel"].get<std::string>().c_str(),
        r["attention_ms"].get<double>(), r["attention_kv_gb_s"].get<double>(),
        r["step_ms"].get<double>(), r["tokens_per_s"].get<double>(),
        r["step_kv_gb_s"].get<double>());
    if (triad) {
      std::printf(" | triad %6.2f GB/s, step at %3.0f%% of it", r["triad_gb_s"].get<double>(),
                  100 * r["step_share_of_triad"].get<double>());
    }
    std::printf("\n");
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
