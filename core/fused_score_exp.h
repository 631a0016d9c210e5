// File: core/fused_score_exp.h
//
// Internal to the fused attention kernel (fused_attention.cc): for a tile of
// keys that no mask touches but maybe the causal one (applied in registers),
// the scores, the softmax's exponentials and the rows' sums in one pass,
// while the scores are still in registers (no score matrix written and read
// back, no separate maximum).
//
// The probabilities are 2^(s - m[r]) against a per-row reference m[r] that
// need not be the running maximum: it only moves (up, by a whole number k,
// so that every rescaling is by 2^-k, exact in float32 and bfloat16) when a
// score exceeds it by more than kSlack. Probabilities stay below 2^kSlack;
// the final division by their sum makes the reference cancel (lazy
// rescaling, as FlashAttention-3 does). Masked tiles keep the same invariant
// with their exact maximum (fused_softmax.h), so both kinds of tiles mix in
// one row.
//
// Include only from translation units compiled with the kernel's AVX-512
// flags, and run only after its CPU check. Stateless; thread-safe.
#ifndef ATTENTION_CORE_FUSED_SCORE_EXP_H_
#define ATTENTION_CORE_FUSED_SCORE_EXP_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/avx512_tiles.h"
#include "core/fused_softmax.h"

namespace attention::fused_internal {

// ScoresExp's `diagonal` when no causal mask applies.
constexpr int64_t kNoDiagonal = std::numeric_limits<int64_t>::max();

// Row r's block of 16 NV scores from column c of the tile, held as x = s -
// m_old (acc, `shift` = -m_old, or 0 for a row with no reference yet), has
// one above the reference + kSlack, or the row has no reference yet
// (`fresh`): moves the reference (MoveReference; a fresh row's, the block's
// top, in registers) and re-bases acc on the new one (x + m_old - m_new:
// m_new - m_old is a whole number, so this is one rounding, as computing
// s - m_new is).
template <int NV>
inline void RebaseRow(__m512 (&acc)[NV], __mmask16 last, const TileRows& st, int64_t r, int64_t c,
                      float shift, bool fresh) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (fresh) {
    // Every row's first block: the reference is the block's top, as
    // MoveReference sets it for a fresh row, taken in registers (a NaN lane
    // keeps the others': max returns its second operand then; lanes past
    // `last` left out). Nothing is accumulated yet, so nothing is rescaled.
    __m512 top = _mm512_set1_ps(kNegInf);
#pragma GCC unroll 4
    for (int v = 0; v + 1 < NV; ++v) top = _mm512_max_ps(acc[v], top);
    top = _mm512_mask_max_ps(top, last, acc[NV - 1], top);
    const float m = _mm512_reduce_max_ps(top);
    st.m[r] = m;
    // Every score -inf or NaN: the row stays without a reference (acc holds
    // the scores, whose 2^x are the 0s and NaNs wanted), so that a later
    // block's finite scores, however low, get theirs exactly (a finite
    // reference set here could only move up: later scores more than 126
    // below it would vanish). Else x = s - m (-inf, and NaN for a +inf
    // score, when the reference is +inf).
    if (m == kNegInf) return;
    const __m512 delta = _mm512_set1_ps(-m);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[v] = _mm512_add_ps(acc[v], delta);
    return;
  }
  __mmask16 over = 0;
  const __m512 limit = _mm512_set1_ps(kSlack);
#pragma GCC unroll 4
  for (int v = 0; v + 1 < NV; ++v) over |= _mm512_cmp_ps_mask(acc[v], limit, _CMP_GT_OQ);
  over |= _mm512_mask_cmp_ps_mask(last, acc[NV - 1], limit, _CMP_GT_OQ);
  if (over == 0) return;
  // The scores themselves, -inf past `last`.
  alignas(64) float scores[16 * NV];
  const __m512 unshift = _mm512_set1_ps(-shift);
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const __m512 s = _mm512_add_ps(acc[v], unshift);
    _mm512_store_ps(scores + 16 * v,
                    v + 1 < NV ? s : _mm512_mask_mov_ps(_mm512_set1_ps(kNegInf), last, s));
  }
  MoveReference(st, r, c, scores, 16 * NV);
  // -(m_new - m_old), exact; -inf when the reference became +inf (every x
  // then -inf or NaN, as s - m_new would be).
  const __m512 delta = _mm512_set1_ps(-st.m[r] - shift);
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) acc[v] = _mm512_add_ps(acc[v], delta);
}

// Scores for R rows and NV vectors of keys of one panel (as
// avx512::ScoreBlock), accumulated onto -m[r] so that they come out already
// shifted by the rows' references; the causal mask added if `diagonal` says
// so (see ScoresExp); the references moved where needed (float32: one test
// for the whole block in the common case that none moves; bfloat16: a test
// per row); then the probabilities 2^x written as float32 or bfloat16 pairs
// and added to the rows' sums.
template <int R, int NV, typename T>
inline void ScoreExpBlock(const T* q, int64_t ldq, const T* panel, int64_t depth, __mmask16 last,
                          const TileRows& st, int64_t r0, int64_t c, int64_t diagonal) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  __m512 acc[R][NV];
  float shift[R];
  bool fresh[R];
  bool any_fresh = false;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const float m = st.m[r0 + r];
    fresh[r] = m == kNegInf;
    any_fresh |= fresh[r];
    shift[r] = fresh[r] ? 0.0f : -m;
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_set1_ps(shift[r]);
  }
  for (int64_t d = 0; d < depth; ++d) {
    avx512::Vec<T> k[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) k[v] = avx512::LoadVec(panel + d * avx512::kPanel + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const avx512::Vec<T> b = avx512::Broadcast(q + r * ldq + d);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = avx512::MulAdd(acc[r][v], k[v], b);
    }
  }
  if (diagonal != kNoDiagonal) {
    // The causal mask: -inf added to the keys after the row's own (a NaN
    // score stays NaN, as PyTorch's additive mask keeps it).
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        const int64_t visible = diagonal + r0 + r + 1 - (c + 16 * v);
        const __mmask16 hidden = static_cast<__mmask16>(~avx512::TailMask(visible));
        acc[r][v] = _mm512_mask_add_ps(acc[r][v], hidden, acc[r][v], _mm512_set1_ps(kNegInf));
      }
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    // One test for the block: does any x exceed kSlack (NaN lanes and lanes
    // past `last` left out)? Independent compares, not a chain of maxima
    // that waits on the last FMAs.
    const __m512 limit = _mm512_set1_ps(kSlack);
    __mmask16 over = 0;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
      for (int v = 0; v + 1 < NV; ++v) over |= _mm512_cmp_ps_mask(acc[r][v], limit, _CMP_GT_OQ);
      over |= _mm512_mask_cmp_ps_mask(last, acc[r][NV - 1], limit, _CMP_GT_OQ);
    }
    if (any_fresh || over != 0) {
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) RebaseRow<NV>(acc[r], last, st, r0 + r, c, shift[r], fresh[r]);
    }
  } else {
    // bfloat16's shorter dot-product loop: a test per row (no chain of
    // maxima for the block's tail to wait on) measured faster.
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) RebaseRow<NV>(acc[r], last, st, r0 + r, c, shift[r], fresh[r]);
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    __m512 p[NV];
    __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      p[v] = st.exact ? avx512::Exp2<5>(acc[r][v]) : avx512::Exp2<3>(acc[r][v]);
      if (v + 1 == NV) p[v] = _mm512_maskz_mov_ps(last, p[v]);
      sum = _mm512_add_ps(sum, p[v]);
    }
    const int64_t row = r0 + r;
    float* sums = st.sums + 16 * row;
    _mm512_storeu_ps(sums, _mm512_add_ps(_mm512_loadu_ps(sums), sum));
    if (st.p16 == nullptr) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(st.p32 + row * st.ld_p + c + 16 * v, p[v]);
      continue;
    }
#pragma GCC unroll 2
    for (int v = 0; v < NV; v += 2) {
      const __m512 hi = v + 1 < NV ? p[v + 1] : _mm512_setzero_ps();
      _mm512_storeu_si512(st.p16 + row * st.ld_p + (c + 16 * v) / 2,
                          (__m512i)_mm512_cvtne2ps_pbh(hi, p[v]));
    }
  }
}

template <int R, typename T>
inline void ScoreExpPanel(int64_t nv, const T* q, int64_t ldq, const T* panel, int64_t depth,
                          __mmask16 last, const TileRows& st, int64_t r0, int64_t c,
                          int64_t diagonal) {
  switch (nv) {
    case 4:
      return ScoreExpBlock<R, 4>(q, ldq, panel, depth, last, st, r0, c, diagonal);
    case 3:
      return ScoreExpBlock<R, 3>(q, ldq, panel, depth, last, st, r0, c, diagonal);
    case 2:
      return ScoreExpBlock<R, 2>(q, ldq, panel, depth, last, st, r0, c, diagonal);
    default:
      return ScoreExpBlock<R, 1>(q, ldq, panel, depth, last, st, r0, c, diagonal);
  }
}

// Probabilities of `rows` queries against `keys` keys of a tile that no
// mask touches but, given a `diagonal` other than kNoDiagonal, the causal one:
// tile row r sees the tile's keys j <= r + diagonal. kt: the keys' panels,
// taken panel by panel (see avx512::Scores).
template <typename T>
inline void ScoresExp(const T* q, int64_t ldq, const T* kt, int64_t depth, int64_t rows,
                      int64_t keys, const TileRows& st, int64_t diagonal = kNoDiagonal) {
  for (int64_t c = 0; c < keys; c += avx512::kPanel) {
    const T* panel = kt + c / avx512::kPanel * depth * avx512::kPanel;
    const int64_t nv = std::min<int64_t>(4, (keys - c + 15) / 16);
    const __mmask16 last = avx512::TailMask(keys - c - 16 * (nv - 1));
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
      ScoreExpPanel<4>(nv, q + r * ldq, ldq, panel, depth, last, st, r, c, diagonal);
    for (; r < rows; ++r)
      ScoreExpPanel<1>(nv, q + r * ldq, ldq, panel, depth, last, st, r, c, diagonal);
  }
}

}  // namespace attention::fused_internal

#endif  // ATTENTION_CORE_FUSED_SCORE_EXP_H_
