// attention-core-bench: times MhaEngine::Forward per shape and prints the
// median latency and achieved GFLOP/s (FLOPs counted as 2NLE^2 for Q,
// 2NS*kdim*E + 2NS*vdim*E for K and V, 4NLS'E for the two attention products
// and 2NLE^2 for the output projection).
//
//   attention-core-bench --batch=8 --seq_len=256 --embed_dim=512 --num_heads=8
//   attention-core-bench --preset=goals --dtype=bfloat16 --json
//   attention-core-bench --model=/path/to/model_dir --seq_len=64
//   attention-core-bench --matmul_peak   # oneDNN 2048^3 float32 matmul
#include <malloc.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "bench/fma_peak.h"
#include "core/fused_attention.h"
#include "core/mha_engine.h"
#include "core/primitive_cache.h"
#include "core/workspace.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int64_t, embed_dim, 256, "Model embedding dimension E (ignored with --model).");
ABSL_FLAG(int64_t, num_heads, 8, "Attention heads H (ignored with --model).");
ABSL_FLAG(int64_t, batch, 1, "Batch size N.");
ABSL_FLAG(int64_t, seq_len, 128, "Query length L.");
ABSL_FLAG(int64_t, kv_seq_len, 0, "Key/value length S; 0 = self-attention on the query.");
ABSL_FLAG(std::string, dtype, "float32",
          "Compute dtype: float32, bfloat16, or int8 (int8 projections, bfloat16 attention; with "
          "--model, a float32 or bfloat16 model is quantized at load).");
ABSL_FLAG(int, threads, 0, "oneDNN (OpenMP) threads; 0 = all cores.");
ABSL_FLAG(bool, need_weights, false, "Also return the attention weights.");
ABSL_FLAG(int, iterations, 50, "Timed iterations per shape (the median is reported).");
ABSL_FLAG(int, warmup, 3,
          "Untimed iterations per shape first; then up to 10 more until one takes no page fault "
          "(a call's output can land on fresh heap pages once or twice before the heap settles).");
ABSL_FLAG(std::string, model, "", "Model directory (config.json + model.safetensors).");
ABSL_FLAG(std::string, preset, "",
          "'goals': the three goal shapes of BENCHMARKS.md (1x128 E768 H12, 8x256 E512 H8, "
          "8x512 E1024 H16), instead of the single shape from the flags.");
ABSL_FLAG(int64_t, score_block_kib, 32768,
          "Engine option: float32 scores kept per query-row block, in KiB.");
ABSL_FLAG(bool, json, false, "Print one JSON object per shape instead of a table.");
ABSL_FLAG(bool, matmul_peak, false, "Also measure a 2048^3 float32 oneDNN matmul.");
ABSL_FLAG(bool, peak, false,
          "Also measure the machine's float32 FMA peak (an AVX-512 FMA loop on every thread) and "
          "report each shape's share of it.");
ABSL_FLAG(bool, is_causal, false, "Self-attention with the causal mask.");
ABSL_FLAG(double, pad_share, 0,
          "Run the batch as the server's mixed batches do: item i keeps a random share in "
          "[0, pad_share) of its length as padding (ForwardBatch), and also time the items alone.");
ABSL_FLAG(int64_t, workspace_kept_bytes, 0,
          "Bytes of workspaces all threads may keep between calls (0: the core's default); the "
          "server sets it from its memory plan (workspaces_kept).");

namespace attention {
namespace {

struct Shape4 {
  int64_t batch, seq_len, kv_seq_len, embed_dim, num_heads;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

template <typename F>
std::vector<double> TimeMs(int warmup, int iterations, F&& f) {
  // Reserved before the first call: a vector growing between calls would
  // carve the heap chunk the last call's output was freed into, and the next
  // output would land on fresh pages (page faults no steady caller sees).
  std::vector<double> ms;
  ms.reserve(static_cast<size_t>(iterations));
  for (int i = 0; i < warmup; ++i) f();
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return ms;
}

int64_t MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

double MatmulPeakGflops(int iterations) {
  const int64_t n = 2048;
  using dt = dnnl::memory::data_type;
  dnnl::memory::desc md({n, n}, dt::f32, dnnl::memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), CpuEngine());
  dnnl::matmul mm(pd);
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n);
  dnnl::stream s(CpuEngine());
  auto ms = TimeMs(2, iterations, [&] {
    mm.execute(s, {{DNNL_ARG_SRC, Wrap(md, a.data())},
                   {DNNL_ARG_WEIGHTS, Wrap(md, b.data())},
                   {DNNL_ARG_DST, Wrap(md, c.data())}});
    s.wait();
  });
  return 2.0 * n * n * n / (Median(ms) * 1e-3) / 1e9;
}

int Run() {
  const int threads = absl::GetFlag(FLAGS_threads);
  if (threads > 0) omp_set_num_threads(threads);
  const bool int8 = absl::GetFlag(FLAGS_dtype) == "int8";
  auto dtype =
      int8 ? absl::StatusOr<DType>(DType::kBFloat16) : ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok() || (*dtype != DType::kFloat32 && *dtype != DType::kBFloat16)) {
    std::cerr << "--dtype must be float32, bfloat16 or int8\n";
    return 2;
  }
  std::shared_ptr<const MhaModel> fixed_model;
  if (!absl::GetFlag(FLAGS_model).empty()) {
    auto m = MhaModel::LoadFromDirectory(absl::GetFlag(FLAGS_model));
    if (!m.ok()) {
      std::cerr << m.status() << "\n";
      return 1;
    }
    fixed_model = *m;
  }
  std::vector<Shape4> shapes;
  if (absl::GetFlag(FLAGS_preset) == "goals") {
    shapes.push_back({1, 32, 0, 256, 8});
    shapes.push_back({1, 128, 0, 768, 12});
    shapes.push_back({8, 256, 0, 512, 8});
    shapes.push_back({8, 512, 0, 1024, 16});
    shapes.push_back({1, 4096, 0, 256, 8});
    shapes.push_back({1, 16384, 0, 256, 8});
  } else if (absl::GetFlag(FLAGS_preset).empty()) {
    shapes.push_back({absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_seq_len),
                      absl::GetFlag(FLAGS_kv_seq_len), absl::GetFlag(FLAGS_embed_dim),
                      absl::GetFlag(FLAGS_num_heads)});
  } else {
    std::cerr << "unknown --preset '" << absl::GetFlag(FLAGS_preset) << "'\n";
    return 2;
  }
  const bool json = absl::GetFlag(FLAGS_json);
  const int iterations = std::max(1, absl::GetFlag(FLAGS_iterations));
  const int used_threads = omp_get_max_threads();
  const double peak = absl::GetFlag(FLAGS_peak) ? FmaPeakGflops() : 0;
  if (!json) {
    if (peak > 0)
      std::printf("float32 FMA-loop peak: %.1f GFLOP/s (%d threads)\n", peak, used_threads);
    std::printf("%-6s %-6s %-6s %-6s %-4s %-9s %-7s %10s %10s %9s %8s %8s %s\n", "N", "L", "S", "E",
                "H", "dtype", "weights", "median_ms", "min_ms", "GFLOP/s", "of_peak", "faults",
                "path");
  }
  for (const Shape4& sh : shapes) {
    std::shared_ptr<const MhaModel> model = fixed_model;
    if (model == nullptr) {
      MhaSpec spec;
      spec.embed_dim = sh.embed_dim;
      spec.num_heads = sh.num_heads;
      spec.kdim = spec.vdim = sh.embed_dim;
      spec.compute_dtype = *dtype;
      spec.int8_weights = int8;
      auto m = MhaModel::Random(spec, 7);
      if (!m.ok()) {
        std::cerr << m.status() << "\n";
        return 1;
      }
      model = *m;
    }
    const MhaSpec& spec = model->spec();
    EngineOptions options;
    options.kernel.score_block_bytes = absl::GetFlag(FLAGS_score_block_kib) * 1024;
    options.int8_weights = int8;
    auto engine = MhaEngine::Create(model, options);
    if (!engine.ok()) {
      std::cerr << engine.status() << "\n";
      return 1;
    }
    const int64_t n = sh.batch, l = sh.seq_len, e = spec.embed_dim;
    const bool cross = sh.kv_seq_len > 0 || spec.kdim != e || spec.vdim != e;
    const int64_t s = sh.kv_seq_len > 0 ? sh.kv_seq_len : l;
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    auto fill = [&](int64_t count) {
      std::vector<float> v(count);
      for (float& x : v) x = normal(rng);
      return v;
    };
    std::vector<float> q = fill(n * l * e), k = fill(n * s * spec.kdim),
                       v = fill(n * s * spec.vdim);
    MhaInputs in;
    in.query = TensorView{DType::kFloat32, {n, l, e}, q.data()};
    if (cross) {
      in.key = TensorView{DType::kFloat32, {n, s, spec.kdim}, k.data()};
      in.value = TensorView{DType::kFloat32, {n, s, spec.vdim}, v.data()};
    }
    in.need_weights = absl::GetFlag(FLAGS_need_weights);
    in.is_causal = absl::GetFlag(FLAGS_is_causal);
    absl::Status status;
    // With --pad_share: the items' own lengths inside the padded batch.
    const double pad_share = absl::GetFlag(FLAGS_pad_share);
    std::vector<ItemMask> items(static_cast<size_t>(n));
    std::uniform_real_distribution<double> share(0.0, pad_share);
    for (ItemMask& item : items) {
      const int64_t len =
          pad_share > 0 ? std::max<int64_t>(1, l - static_cast<int64_t>(share(rng) * l)) : l;
      item.valid_queries = len;
      item.valid_keys = cross ? s : len;
      item.is_causal = in.is_causal;
    }
    std::vector<float> batch_out(pad_share > 0 ? n * l * e : 0);
    auto call = [&] {
      if (pad_share > 0) {
        status.Update(
            (*engine)->ForwardBatch(in.query, in.key, in.value, items, batch_out.data(), nullptr));
        return;
      }
      auto out = (*engine)->Forward(in);
      if (!out.ok()) status = out.status();
    };
    // Steady state only: the warm-up calls create primitives and workspaces;
    // the timed calls' vector exists before them (see TimeMs).
    std::vector<double> ms;
    ms.reserve(static_cast<size_t>(iterations));
    TimeMs(absl::GetFlag(FLAGS_warmup), 0, call);
    for (int extra = 0; extra < 10; ++extra) {
      const int64_t before = MinorFaults();
      TimeMs(1, 0, call);
      if (MinorFaults() == before) break;
    }
    const int64_t faults0 = MinorFaults();
    for (int i = 0; i < iterations; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      call();
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    const double faults_per_call = static_cast<double>(MinorFaults() - faults0) / iterations;
    if (!status.ok()) {
      std::cerr << status << "\n";
      return 1;
    }
    // The same items computed one by one at their own lengths.
    double solo_sum_ms = 0;
    if (pad_share > 0) {
      for (int64_t i = 0; i < n; ++i) {
        MhaInputs one = in;
        one.query =
            TensorView{DType::kFloat32, {1, items[i].valid_queries, e}, q.data() + i * l * e};
        if (cross) {
          one.key = TensorView{DType::kFloat32, {1, s, spec.kdim}, k.data() + i * s * spec.kdim};
          one.value = TensorView{DType::kFloat32, {1, s, spec.vdim}, v.data() + i * s * spec.vdim};
        }
        solo_sum_ms += Median(TimeMs(1, std::max(3, iterations / 2), [&] {
          auto out = (*engine)->Forward(one);
          if (!out.ok()) status = out.status();
        }));
      }
    }
    const int64_t s_total = s + spec.extra_keys();
    const double flops = 2.0 * n * l * e * e + 2.0 * n * s * spec.kdim * e +
                         2.0 * n * s * spec.vdim * e + 4.0 * n * l * s_total * e +
                         2.0 * n * l * e * e;
    const double median = Median(ms);
    const double gflops = flops / (median * 1e-3) / 1e9;
    const double min_ms = *std::min_element(ms.begin(), ms.end());
    const std::string dtype_name =
        int8 || spec.int8_weights ? "int8" : std::string(DTypeName(spec.compute_dtype));
    if (json) {
      nlohmann::json j = {{"batch", n},
                          {"seq_len", l},
                          {"kv_seq_len", s},
                          {"embed_dim", e},
                          {"num_heads", spec.num_heads},
                          {"dtype", dtype_name},
                          {"threads", used_threads},
                          {"need_weights", in.need_weights},
                          {"iterations", iterations},
                          {"median_ms", median},
                          {"min_ms", min_ms},
                          {"gflops", gflops},
                          {"is_causal", in.is_causal},
                          {"path", in.need_weights ? "onednn-primitives" : AttentionPathName()},
                          {"minor_faults_per_call", faults_per_call}};
      if (pad_share > 0) {
        j["pad_share"] = pad_share;
        j["solo_sum_ms"] = solo_sum_ms;
        j["batch_over_solo"] = median / solo_sum_ms;
      }
      if (peak > 0) {
        j["peak_gflops"] = peak;
        j["share_of_peak"] = gflops / peak;
      }
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-6ld %-6ld %-6ld %-6ld %-4ld %-9s %-7s %10.3f %10.3f %9.1f %7.1f%% %8.1f %s\n",
                  n, l, s, e, spec.num_heads, dtype_name.c_str(), in.need_weights ? "yes" : "no",
                  median, min_ms, gflops, peak > 0 ? 100 * gflops / peak : 0.0, faults_per_call,
                  in.need_weights ? "onednn-primitives" : AttentionPathName());
      if (pad_share > 0) {
        std::printf("  items alone: %.3f ms in all; the padded batch costs %.2fx that\n",
                    solo_sum_ms, median / solo_sum_ms);
      }
    }
  }
  if (absl::GetFlag(FLAGS_matmul_peak)) {
    const double peak = MatmulPeakGflops(std::max(5, iterations / 5));
    if (json) {
      std::printf(
          "%s\n",
          nlohmann::json({{"matmul_peak_gflops", peak}, {"threads", used_threads}}).dump().c_str());
    } else {
      std::printf("oneDNN 2048^3 float32 matmul: %.1f GFLOP/s (%d threads)\n", peak, used_threads);
    }
  }
  return 0;
}

}  // namespace
}  // namespace attention

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times the attention engine per shape: attention-core-bench [--flags]; see --help.");
  absl::FlagsUsageConfig usage;  // --help lists this binary's own flags.
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "core_bench.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] { return std::string("attention-core-bench " ATTENTION_VERSION "\n"); };
  absl::SetFlagsUsageConfig(usage);
  // glibc returns freed blocks above its mmap threshold to the OS, and the
  // next call's buffers of the same size fault in again, a page at a time
  // (expensive on these VMs). Serve up to 32 MiB from the heap and keep up
  // to 256 MiB of freed memory there for reuse.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_workspace_kept_bytes) > 0) {
    attention::Workspace::SetKeptLimit(
        static_cast<size_t>(absl::GetFlag(FLAGS_workspace_kept_bytes)));
  }
  return attention::Run();
}
