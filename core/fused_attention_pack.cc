#include "core/fused_attention_pack.h"

#include <algorithm>

namespace attention::fused_internal {

// K^T (D, ldk) and V (S', ldq) of one item and head as float32.
void PackFloat32(const AttentionProblem& p, int64_t item, int64_t h, int64_t ldk, int64_t ldq,
                 float* kt, float* v) {
  const int64_t keys = p.k.t, depth = p.q.d;
  float row[16 * 256];  // 16 keys of up to 256 features, transposed 16 at a time.
  const int64_t chunk = depth <= 256 ? 16 : 1;
  for (int64_t j0 = 0; j0 < keys; j0 += chunk) {
    const int64_t count = std::min(chunk, keys - j0);
    for (int64_t j = 0; j < count; ++j) {
      const char* src = Element(p.k, item, h, j0 + j);
      if (depth <= 256) {
        LoadRow(p.k.dtype, src, depth, 1.0f, row + j * depth);
      } else {
        LoadRow(p.k.dtype, src, depth, 1.0f, v);  // v as a row buffer, filled below.
        for (int64_t d = 0; d < depth; ++d) kt[d * ldk + j0] = v[d];
      }
    }
    if (depth <= 256) {
      for (int64_t d = 0; d < depth; ++d)
        for (int64_t j = 0; j < count; ++j) kt[d * ldk + j0 + j] = row[j * depth + d];
    }
  }
  for (int64_t d = 0; d < depth; ++d) std::fill(kt + d * ldk + keys, kt + (d + 1) * ldk, 0.0f);
  for (int64_t j = 0; j < keys; ++j) {
    LoadRow(p.v.dtype, Element(p.v, item, h, j), depth, 1.0f, v + j * ldq);
    std::fill(v + j * ldq + depth, v + (j + 1) * ldq, 0.0f);
  }
}

// bfloat16 mode: K^T as words of feature pairs (ceil(D/2), ldk), and V as
// rows of key pairs (ldq words: feature d of keys 2u and 2u + 1), the main
// `main_keys` keys' pairs first, then the appended keys' pairs.
void PackBFloat16(const AttentionProblem& p, int64_t item, int64_t h, int64_t main_keys,
                  int64_t ldk, int64_t ldq, uint32_t* kt, uint32_t* v) {
  const int64_t keys = p.k.t, depth = p.q.d, depth_pairs = (depth + 1) / 2;
  auto k_row = [&](int64_t j) {
    return reinterpret_cast<const uint16_t*>(Element(p.k, item, h, j));
  };
  for (int64_t j = 0; j < keys; ++j) {
    const uint16_t* k = k_row(j);
    for (int64_t u = 0; u < depth_pairs; ++u) {
      const uint32_t hi = 2 * u + 1 < depth ? k[2 * u + 1] : 0;
      kt[u * ldk + j] = k[2 * u] | hi << 16;
    }
  }
  for (int64_t u = 0; u < depth_pairs; ++u) std::fill(kt + u * ldk + keys, kt + (u + 1) * ldk, 0u);
  uint32_t* out = v;
  for (int64_t begin : {int64_t{0}, main_keys}) {
    const int64_t end = begin == 0 ? main_keys : keys;
    for (int64_t j = begin; j < end; j += 2, out += ldq) {
      const uint16_t* a = reinterpret_cast<const uint16_t*>(Element(p.v, item, h, j));
      const uint16_t* b =
          j + 1 < end ? reinterpret_cast<const uint16_t*>(Element(p.v, item, h, j + 1)) : nullptr;
      for (int64_t d = 0; d < depth; ++d)
        out[d] = a[d] | (b != nullptr ? uint32_t{b[d]} << 16 : 0u);
      std::fill(out + depth, out + ldq, 0u);
    }
  }
}

// True when one of `count` packed words is NaN or infinite: float32 words,
// or (`pairs`) either bfloat16 half of a word.
bool AnyNonFinite(const uint32_t* words, int64_t count, bool pairs) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < count; ++i) {
    bad |= static_cast<uint32_t>((words[i] & 0x7F800000u) == 0x7F800000u);
    if (pairs) bad |= static_cast<uint32_t>((words[i] & 0x7F80u) == 0x7F80u);
  }
  return bad != 0;
}

}  // namespace attention::fused_internal
