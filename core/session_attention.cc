#include "core/session_attention.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/session_decode.h"
#include "core/session_kernel.h"
#include "core/workspace.h"

namespace attention {
namespace {

constexpr int64_t kB = KvCache::kBlockTokens;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;
// A split reads at least this many blocks (a long enough sequential run).
constexpr int64_t kMinSplitBlocks = 8;
// Partials (floats) above which the merge runs on every thread.
constexpr int64_t kParallelMergeFloats = int64_t{1} << 20;

bool CpuHasAvx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }();
  return has;
}

bool DecodeDisabledByEnv() {
  static const bool off = [] {
    const char* env = std::getenv("ATTENTION_SESSION_DECODE");
    return env != nullptr && std::strcmp(env, "0") == 0;
  }();
  return off;
}

SessionRow HeadRow(const AttentionRow& row, int64_t h, const AttentionExtras& extras) {
  const int64_t d = row.cache->head_dim();
  SessionRow r;
  r.cache = row.cache;
  r.head = h;
  r.keys = row.keys;
  r.stored = row.stored;
  r.q = row.q + h * d;
  if (extras.bias_k != nullptr) {
    r.bias_k = extras.bias_k + h * d;
    r.bias_v = extras.bias_v + h * d;
  }
  r.zero_attn = extras.zero_attn;
  r.context = row.context + h * d;
  if (row.weights != nullptr) r.weights = row.weights + h * row.weights_head_stride;
  return r;
}

// A task: split `part` of a decode row, or head `part` of a reference row.
struct Task {
  int64_t row;
  int64_t part;
  bool decode;
};

// GetDecodePrefetch's setting, packed: planes << 2 | hint.
std::atomic<int64_t>& PrefetchSetting() {
  static std::atomic<int64_t> setting = [] {
    DecodePrefetch p;
    const char* planes = std::getenv("ATTENTION_DECODE_PREFETCH");
    const char* hint = std::getenv("ATTENTION_DECODE_PREFETCH_HINT");
    if (planes != nullptr) p.planes = std::max<int64_t>(0, std::atoll(planes));
    if (hint != nullptr) p.hint = std::clamp(std::atoi(hint), 0, 2);
    return p.planes << 2 | p.hint;
  }();
  return setting;
}

}  // namespace

DecodePrefetch GetDecodePrefetch() {
  const int64_t s = PrefetchSetting().load(std::memory_order_relaxed);
  return DecodePrefetch{s >> 2, static_cast<int>(s & 3)};
}

void SetDecodePrefetch(const DecodePrefetch& p) {
  PrefetchSetting().store(std::max<int64_t>(0, p.planes) << 2 | std::clamp(p.hint, 0, 2),
                          std::memory_order_relaxed);
}

bool DecodeSupports(const KvCache& cache) {
  const int64_t d = cache.head_dim();
  return CpuHasAvx512() && d % 16 == 0 && d >= 16 && d <= 128 &&
         (cache.dtype() == DType::kFloat32 || cache.dtype() == DType::kBFloat16);
}

int64_t DecodeSplits(int64_t keys, int64_t rows, int threads) {
  const int64_t target = std::min<int64_t>(4 * std::max(threads, 1), kMaxSplitTasks);
  const int64_t wanted = (target + std::max<int64_t>(rows, 1) - 1) / std::max<int64_t>(rows, 1);
  const int64_t by_length = ((keys + kB - 1) / kB) / kMinSplitBlocks;
  return std::max<int64_t>(1, std::min(wanted, by_length));
}

int64_t DecodePartialBytes(int64_t rows, int64_t heads, int64_t head_dim) {
  return (rows + kMaxSplitTasks) * heads * DecodePartialStride(head_dim) *
         static_cast<int64_t>(sizeof(float));
}

void MergeDecodePartials(const float* partials, int64_t splits, const AttentionRow& row,
                         int64_t head, const AttentionExtras& extras) {
  const int64_t heads = row.cache->heads(), d = row.cache->head_dim();
  const int64_t stride = DecodePartialStride(d);
  const float* q = row.q + head * d;
  bool bad = false;
  float top = kNegInf;
  for (int64_t s = 0; s < splits; ++s) {
    const float* p = partials + (s * heads + head) * stride + d;
    bad |= p[kDecodeBadAt] != 0.0f;
    top = std::max(top, p[kDecodeMaxAt]);
  }
  // The extra keys' scores in log2 units.
  float bias_score = kNegInf;
  if (extras.bias_k != nullptr) {
    float dot = 0;
    for (int64_t j = 0; j < d; ++j) dot += q[j] * extras.bias_k[head * d + j];
    bias_score = dot * kLog2e;
    bad |= std::isnan(bias_score) || bias_score == -kNegInf;
    top = std::max(top, bias_score);
  }
  if (extras.zero_attn) top = std::max(top, 0.0f);
  if (bad || top == kNegInf) {
    AttendSessionRow(HeadRow(row, head, extras));
    return;
  }
  float* out = row.context + head * d;
  std::fill(out, out + d, 0.0f);
  float sum = 0;
  for (int64_t s = 0; s < splits; ++s) {
    const float* p = partials + (s * heads + head) * stride;
    // 0 for a split that saw no key: its context holds only 0 x V (0, or
    // NaN where a masked key's value is NaN, which stays NaN).
    const float f = std::exp2(p[d + kDecodeMaxAt] - top);
    float lanes = 0;
    for (int i = 0; i < 16; ++i) lanes += p[d + kDecodeSumAt + i];
    sum += f * lanes;
    for (int64_t j = 0; j < d; ++j) out[j] += f * p[j];
  }
  if (extras.bias_k != nullptr) {
    const float f = std::exp2(bias_score - top);
    sum += f;
    for (int64_t j = 0; j < d; ++j) out[j] += f * extras.bias_v[head * d + j];
  }
  if (extras.zero_attn) sum += std::exp2(-top);
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < d; ++j) out[j] *= inv;
}

void AttendRows(const std::vector<AttentionRow>& rows, const AttentionExtras& extras,
                SessionKernel kernel) {
  if (rows.empty()) return;
  const bool allow = kernel == SessionKernel::kDecode ||
                     (kernel == SessionKernel::kAuto && !DecodeDisabledByEnv());
  const int threads = omp_get_max_threads();
  int64_t decode_rows = 0;
  std::vector<char> decode(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    decode[i] = allow && rows[i].weights == nullptr && DecodeSupports(*rows[i].cache);
    decode_rows += decode[i];
  }
  // Tasks, and each decode row's first partial.
  std::vector<Task> tasks;
  std::vector<int64_t> first(rows.size() + 1, 0), splits(rows.size(), 0);
  int64_t partial_floats = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const AttentionRow& row = rows[i];
    const int64_t heads = row.cache->heads();
    const int64_t n = static_cast<int64_t>(i);
    first[i] = partial_floats;
    if (!decode[i]) {
      for (int64_t h = 0; h < heads; ++h) tasks.push_back({n, h, false});
      continue;
    }
    splits[i] = DecodeSplits(row.keys, decode_rows, threads);
    for (int64_t s = 0; s < splits[i]; ++s) tasks.push_back({n, s, true});
    partial_floats += splits[i] * heads * DecodePartialStride(row.cache->head_dim());
  }
  const DecodePrefetch prefetch = GetDecodePrefetch();
  Workspace partials(Workspace::kStepPartials, static_cast<size_t>(partial_floats) * sizeof(float));
  const int64_t count = static_cast<int64_t>(tasks.size());
#pragma omp parallel for schedule(dynamic, 1) if (count > 1)
  for (int64_t k = 0; k < count; ++k) {
    const Task& task = tasks[static_cast<size_t>(k)];
    const AttentionRow& row = rows[static_cast<size_t>(task.row)];
    if (!task.decode) {
      AttendSessionRow(HeadRow(row, task.part, extras));
      continue;
    }
    // Split s of S takes blocks [nb s / S, nb (s + 1) / S).
    const int64_t nb = (row.keys + kB - 1) / kB, s = task.part;
    const int64_t n_splits = splits[static_cast<size_t>(task.row)];
    DecodeRange r;
    r.cache = row.cache;
    r.begin = nb * s / n_splits * kB;
    r.end = std::min(row.keys, nb * (s + 1) / n_splits * kB);
    r.q = row.q;
    r.prefetch = prefetch;
    r.partial = partials.as<float>() + first[static_cast<size_t>(task.row)] +
                s * row.cache->heads() * DecodePartialStride(row.cache->head_dim());
    DecodeRangeAvx512(r);
  }
  if (decode_rows == 0) return;
  // The merge reads the partials once (a few microseconds for a batch of
  // decode steps): on the calling thread, unless there are many, since a
  // parallel region costs a wake-up of every thread (and, on a loaded
  // machine, a wait for a descheduled one).
  const int64_t n_rows = static_cast<int64_t>(rows.size());
#pragma omp parallel for schedule(dynamic, 4) if (partial_floats > kParallelMergeFloats)
  for (int64_t i = 0; i < n_rows; ++i) {
    if (!decode[static_cast<size_t>(i)]) continue;
    const AttentionRow& row = rows[static_cast<size_t>(i)];
    for (int64_t h = 0; h < row.cache->heads(); ++h) {
      MergeDecodePartials(partials.as<float>() + first[static_cast<size_t>(i)],
                          splits[static_cast<size_t>(i)], row, h, extras);
    }
  }
}

}  // namespace attention
