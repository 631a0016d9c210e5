#include "core/session_kernel.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace attention {
namespace {

constexpr int64_t kB = KvCache::kBlockTokens;

inline float Load(const float* p, int64_t i) { return p[i]; }
inline float Load(const uint16_t* p, int64_t i) {
  const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

template <typename T>
__attribute__((always_inline)) inline void Attend(const SessionRow& row, float* scores) {
  const KvCache& cache = *row.cache;
  const int64_t d_count = cache.head_dim(), keys = row.keys;
  const float* key_bias = cache.key_bias();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float max = kNegInf;
  const int64_t blocks = (keys + kB - 1) / kB;
  for (int64_t b = 0; b < blocks; ++b) {
    const T* kt = static_cast<const T*>(cache.Keys(b, row.head));
    float s[kB] = {};
    for (int64_t d = 0; d < d_count; ++d) {
      const float q = row.q[d];
      for (int64_t t = 0; t < kB; ++t) s[t] += q * Load(kt + d * kB, t);
    }
    const int64_t n = std::min<int64_t>(kB, keys - b * kB);
    for (int64_t t = 0; t < n; ++t) {
      const float score = s[t] + key_bias[b * kB + t];
      scores[b * kB + t] = score;
      max = std::max(max, score);
    }
  }
  float extra[2];
  int extras = 0;
  if (row.bias_k != nullptr) {
    float dot = 0;
    for (int64_t d = 0; d < d_count; ++d) dot += row.q[d] * row.bias_k[d];
    extra[extras++] = dot;
    max = std::max(max, dot);
  }
  if (row.zero_attn) {
    extra[extras++] = 0.0f;
    max = std::max(max, 0.0f);
  }
  float* out = row.context;
  std::fill(out, out + d_count, 0.0f);
  float* w = row.weights;
  if (w != nullptr) std::fill(w, w + row.stored + extras, 0.0f);

  // The probabilities are scores[j] * inv. std::max skips NaN, so max is -inf
  // when every score is -inf or NaN: with no NaN the row is fully masked (zero
  // weights, context 0 * V); with one (a NaN query, key or mask entry) it is
  // all NaN, as PyTorch's softmax makes it.
  float inv;
  if (max == kNegInf) {
    bool nan = false;
    for (int64_t j = 0; j < keys; ++j) nan |= std::isnan(scores[j]);
    for (int i = 0; i < extras; ++i) nan |= std::isnan(extra[i]);
    std::fill(scores, scores + keys, 0.0f);
    std::fill(extra, extra + extras, 0.0f);
    inv = nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
  } else {
    float sum = 0;  // NaN if a score is.
    for (int64_t j = 0; j < keys; ++j) {
      const float e = scores[j] == kNegInf ? 0.0f : std::exp(scores[j] - max);
      scores[j] = e;
      sum += e;
    }
    for (int i = 0; i < extras; ++i) {
      extra[i] = std::exp(extra[i] - max);
      sum += extra[i];
    }
    inv = 1.0f / sum;
  }
  // Every key the row sees, including masked ones: 0 * a NaN value is NaN, as
  // in PyTorch's product of the probabilities with V.
  for (int64_t b = 0; b < blocks; ++b) {
    const T* v = static_cast<const T*>(cache.Values(b, row.head));
    const int64_t n = std::min<int64_t>(kB, keys - b * kB);
    for (int64_t t = 0; t < n; ++t) {
      const float p = scores[b * kB + t] * inv;
      for (int64_t d = 0; d < d_count; ++d) out[d] += p * Load(v + t * d_count, d);
    }
  }
  if (row.bias_k != nullptr) {
    const float p = extra[0] * inv;
    for (int64_t d = 0; d < d_count; ++d) out[d] += p * row.bias_v[d];
  }
  if (w != nullptr) {
    for (int64_t j = 0; j < keys; ++j) w[j] = scores[j] * inv;
    for (int i = 0; i < extras; ++i) w[row.stored + i] = extra[i] * inv;
  }
}

// An AVX-512 clone and a default one, picked at load time by an ifunc
// resolver. ThreadSanitizer instruments that resolver, which then runs before
// TSan's runtime is set up and crashes the process at load: TSan builds
// (scripts/sanitize.sh) keep the default clone only.
#if defined(__SANITIZE_THREAD__)
#define ATTN_AVX512_CLONES
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ATTN_AVX512_CLONES
#endif
#endif
#ifndef ATTN_AVX512_CLONES
#define ATTN_AVX512_CLONES __attribute__((target_clones("avx512f", "default")))
#endif

ATTN_AVX512_CLONES void AttendFloat32(const SessionRow& row, float* scores) {
  Attend<float>(row, scores);
}

ATTN_AVX512_CLONES void AttendBFloat16(const SessionRow& row, float* scores) {
  Attend<uint16_t>(row, scores);
}

}  // namespace

void AttendSessionRow(const SessionRow& row) {
  thread_local std::vector<float> scores;
  const size_t needed = static_cast<size_t>((row.keys + kB - 1) / kB * kB);
  if (scores.size() < needed) scores.resize(needed);
  if (row.cache->dtype() == DType::kBFloat16) {
    AttendBFloat16(row, scores.data());
  } else {
    AttendFloat32(row, scores.data());
  }
}

}  // namespace attention
