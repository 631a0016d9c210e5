#include "core/fused_attention_pack.h"

#include <immintrin.h>

#include <algorithm>

#include "core/avx512_tiles.h"

namespace attention::fused_internal {

namespace {

using avx512::kPanel;

// Rows of V fetched ahead of the one packed.
constexpr int64_t kAhead = 8;

// r[i][j] <- r[j][i] for 16 vectors of 16 32-bit lanes.
void Transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

// Lanes [w0, w0 + 16) of key j's row as 32-bit words (zero past `words`):
// float32 features (`pairs` false, bfloat16 keys widened), or words of
// bfloat16 feature pairs (`pairs`; an odd depth's last word has a zero high
// half).
__m512i KeyWords(const AttentionProblem& p, int64_t item, int64_t h, int64_t j, int64_t w0,
                 int64_t words, bool pairs) {
  const char* src = Element(p.k, item, h, j);
  if (pairs) {
    const int64_t halves = std::min<int64_t>(32, p.q.d - 2 * w0);
    const __mmask32 lanes = halves >= 32 ? ~__mmask32{0} : (__mmask32{1} << halves) - 1;
    return _mm512_maskz_loadu_epi16(lanes, reinterpret_cast<const uint16_t*>(src) + 2 * w0);
  }
  const __mmask16 lanes = avx512::TailMask(words - w0);
  if (p.k.dtype == DType::kFloat32) {
    return _mm512_maskz_loadu_epi32(lanes, reinterpret_cast<const float*>(src) + w0);
  }
  const __m256i b = _mm256_maskz_loadu_epi16(lanes, reinterpret_cast<const uint16_t*>(src) + w0);
  return _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16);
}

// K^T panels of 32-bit words (`words` per key): keys [begin, end) into
// panels from `first_panel`, 16 keys by 16 words at a time, zero-padded.
void PackKeys(const AttentionProblem& p, int64_t item, int64_t h, int64_t begin, int64_t end,
              int64_t first_panel, int64_t words, bool pairs, uint32_t* kt) {
  const int64_t panels = (end - begin + kPanel - 1) / kPanel;
  const int64_t key_bytes = p.q.d * static_cast<int64_t>(DTypeSize(p.k.dtype));
  for (int64_t panel = 0; panel < panels; ++panel) {
    uint32_t* dst = kt + (first_panel + panel) * words * kPanel;
    for (int64_t c0 = 0; c0 < kPanel; c0 += 16) {
      const int64_t j0 = begin + panel * kPanel + c0;
      for (int64_t i = 16; i < 32 && j0 + i < end; ++i) {  // The next 16 keys' rows.
        PrefetchBytes(Element(p.k, item, h, j0 + i), key_bytes, false);
      }
      for (int64_t w0 = 0; w0 < words; w0 += 16) {
        __m512i r[16];
        for (int64_t i = 0; i < 16; ++i) {
          r[i] = j0 + i < end ? KeyWords(p, item, h, j0 + i, w0, words, pairs)
                              : _mm512_setzero_si512();
        }
        Transpose16(r);
        for (int64_t u = 0; u < 16 && w0 + u < words; ++u)
          _mm512_storeu_si512(dst + (w0 + u) * kPanel + c0, r[u]);
      }
    }
  }
}

}  // namespace

void PackFloat32(const AttentionProblem& p, int64_t item, int64_t h, int64_t main_keys, int64_t ldq,
                 float* kt, float* v) {
  const int64_t keys = p.k.t, depth = p.q.d;
  const int64_t main_panels = (main_keys + kPanel - 1) / kPanel;
  uint32_t* words = reinterpret_cast<uint32_t*>(kt);
  PackKeys(p, item, h, 0, main_keys, 0, depth, /*pairs=*/false, words);
  PackKeys(p, item, h, main_keys, keys, main_panels, depth, /*pairs=*/false, words);
  const int64_t v_bytes = depth * static_cast<int64_t>(DTypeSize(p.v.dtype));
  for (int64_t j = 0; j < keys; ++j) {
    if (j + kAhead < keys) PrefetchBytes(Element(p.v, item, h, j + kAhead), v_bytes, false);
    LoadRow(p.v.dtype, Element(p.v, item, h, j), depth, 1.0f, v + j * ldq);
    std::fill(v + j * ldq + depth, v + (j + 1) * ldq, 0.0f);
  }
}

void PackBFloat16(const AttentionProblem& p, int64_t item, int64_t h, int64_t main_keys,
                  int64_t ldq, uint32_t* kt, uint32_t* v) {
  const int64_t keys = p.k.t, depth = p.q.d, depth_pairs = (depth + 1) / 2;
  const int64_t main_panels = (main_keys + kPanel - 1) / kPanel;
  PackKeys(p, item, h, 0, main_keys, 0, depth_pairs, /*pairs=*/true, kt);
  PackKeys(p, item, h, main_keys, keys, main_panels, depth_pairs, /*pairs=*/true, kt);
  // V: word d of pair row u holds feature d of keys 2u (low) and 2u + 1.
  uint32_t* out = v;
  for (int64_t begin : {int64_t{0}, main_keys}) {
    const int64_t end = begin == 0 ? main_keys : keys;
    for (int64_t j = begin; j < end; j += 2, out += ldq) {
      const uint16_t* a = reinterpret_cast<const uint16_t*>(Element(p.v, item, h, j));
      const uint16_t* b =
          j + 1 < end ? reinterpret_cast<const uint16_t*>(Element(p.v, item, h, j + 1)) : nullptr;
      for (int64_t d = 0; d < ldq; d += 16) {
        const __mmask16 lanes = avx512::TailMask(depth - d);
        const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, a + d));
        __m512i word = lo;
        if (b != nullptr) {
          const __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, b + d));
          word = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
        }
        _mm512_storeu_si512(out + d, word);
      }
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

bool AnyNonFiniteRows(const float* rows, int64_t count, int64_t ld, int64_t width) {
  for (int64_t r = 0; r < count; ++r) {
    if (AnyNonFinite(reinterpret_cast<const uint32_t*>(rows + r * ld), width, /*pairs=*/false)) {
      return true;
    }
  }
  return false;
}

}  // namespace attention::fused_internal
