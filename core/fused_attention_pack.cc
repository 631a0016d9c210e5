#include "core/fused_attention_pack.h"

#include <algorithm>

#include "core/avx512_tiles.h"

namespace attention::fused_internal {

namespace {

using avx512::kPanel;

// Calls put(key j, its panel column) for keys [begin, end) and `zero(panel
// column)` for the panel's padding, panel by panel from `first_panel`.
template <typename Put, typename Zero>
void ForPanels(int64_t begin, int64_t end, int64_t first_panel, Put put, Zero zero) {
  for (int64_t j0 = begin, panel = first_panel; j0 < end; j0 += kPanel, ++panel) {
    for (int64_t c = 0; c < kPanel; ++c) {
      if (j0 + c < end) {
        put(j0 + c, panel, c);
      } else {
        zero(panel, c);
      }
    }
  }
}

}  // namespace

void PackFloat32(const AttentionProblem& p, int64_t item, int64_t h, int64_t main_keys, int64_t ldq,
                 float* kt, float* v) {
  const int64_t keys = p.k.t, depth = p.q.d;
  const int64_t main_panels = (main_keys + kPanel - 1) / kPanel;
  float row[256];
  auto put = [&](int64_t j, int64_t panel, int64_t c) {
    float* dst = kt + panel * depth * kPanel + c;
    const char* src = Element(p.k, item, h, j);
    for (int64_t d0 = 0; d0 < depth; d0 += 256) {
      const int64_t count = std::min<int64_t>(256, depth - d0);
      LoadRow(p.k.dtype, src + d0 * static_cast<int64_t>(DTypeSize(p.k.dtype)), count, 1.0f, row);
      for (int64_t d = 0; d < count; ++d) dst[(d0 + d) * kPanel] = row[d];
    }
  };
  auto zero = [&](int64_t panel, int64_t c) {
    for (int64_t d = 0; d < depth; ++d) kt[(panel * depth + d) * kPanel + c] = 0.0f;
  };
  ForPanels(0, main_keys, 0, put, zero);
  ForPanels(main_keys, keys, main_panels, put, zero);
  for (int64_t j = 0; j < keys; ++j) {
    LoadRow(p.v.dtype, Element(p.v, item, h, j), depth, 1.0f, v + j * ldq);
    std::fill(v + j * ldq + depth, v + (j + 1) * ldq, 0.0f);
  }
}

void PackBFloat16(const AttentionProblem& p, int64_t item, int64_t h, int64_t main_keys,
                  int64_t ldq, uint32_t* kt, uint32_t* v) {
  const int64_t keys = p.k.t, depth = p.q.d, depth_pairs = (depth + 1) / 2;
  const int64_t main_panels = (main_keys + kPanel - 1) / kPanel;
  auto put = [&](int64_t j, int64_t panel, int64_t c) {
    const uint16_t* k = reinterpret_cast<const uint16_t*>(Element(p.k, item, h, j));
    uint32_t* dst = kt + panel * depth_pairs * kPanel + c;
    for (int64_t u = 0; u < depth_pairs; ++u) {
      const uint32_t hi = 2 * u + 1 < depth ? k[2 * u + 1] : 0;
      dst[u * kPanel] = k[2 * u] | hi << 16;
    }
  };
  auto zero = [&](int64_t panel, int64_t c) {
    for (int64_t u = 0; u < depth_pairs; ++u) kt[(panel * depth_pairs + u) * kPanel + c] = 0u;
  };
  ForPanels(0, main_keys, 0, put, zero);
  ForPanels(main_keys, keys, main_panels, put, zero);
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
