// File: core/fused_softmax.h
//
// Internal to the fused attention kernel (fused_attention.cc): the online
// softmax over one tile of scores, row by row, in log2 units (the kernel
// scales Q and the masks by log2(e), so that probabilities are 2^x).
//
// For each row r of the tile, with its running maximum m[r] and its running
// sum kept as 16 partial lanes (sums[16 r .. 16 r + 15], added up once at
// the end of the row's keys, SumLanes):
//   m_new = max(m[r], the row's scores); s = 2^(s - m_new);
//   sums = sums * alpha[r] + the row's probabilities, with alpha[r] =
//   2^(m[r] - m_new) the factor the row's accumulated context must be scaled
//   by (exactly 1 when the maximum did not move, 0 when nothing was
//   attendable before).
// A row with nothing attendable so far (every score -inf) is left at zero
// probabilities with alpha 1; a NaN score makes the row's sum NaN for good
// (through 2^x, or explicitly when nothing else is attendable yet), so the
// row comes out NaN, as PyTorch's softmax makes it.
//
// Compiled with the kernel's AVX-512 flags and called only after its
// run-time CPU check. Stateless; thread-safe.
#ifndef ATTENTION_CORE_FUSED_SOFTMAX_H_
#define ATTENTION_CORE_FUSED_SOFTMAX_H_

#include <cstdint>

namespace attention::fused_internal {

// The softmax step for `rows` rows of `keys` scores in `s` (row stride lds),
// for a tile that a mask touches. The probabilities replace the
// scores (2^x within 1.7e-7: float32 results), or, given `pairs`, are written
// there as bfloat16 pairs of keys, row stride ldp words ((keys + 1) / 2 per
// row, key 2u in word u's low half; 2^x within 1e-4, far below bfloat16's
// rounding). m (rows), sums (rows x 16) and alpha (rows, written) as
// described above.
void SoftmaxTile(float* s, int64_t lds, int64_t rows, int64_t keys, uint32_t* pairs, int64_t ldp,
                 float* m, float* sums, float* alpha);

// The state of a tile's rows for the fused score kernel of unmasked tiles
// (fused_score_exp.h), which writes the probabilities itself.
struct TileRows {
  float* m;     // Per row: the reference, log2 units (see SoftmaxTile's m).
  float* sums;  // Per row: 16 lanes of its running sum.
  float* o;     // Per row: its context so far, ld_o floats apart.
  int64_t ld_o;
  float* p32;     // The tile's float32 probabilities, ld_p apart, or
  uint32_t* p16;  // as bfloat16 pairs of keys, ld_p words apart.
  int64_t ld_p;
  bool exact;  // 2^x within 1.7e-7 (float32 results), else within 1e-4.
};

// How far (log2 units) a score may exceed its row's reference before the
// reference moves: probabilities stay below 2^kSlack.
constexpr float kSlack = 8.0f;

// Row r's block of `count` scores, from column c of the tile, has one above
// m[r] + kSlack (m[r] finite or +inf: a row's first reference is set by
// RebaseRow in fused_score_exp.h): moves the reference up by the whole number
// k of steps that puts the maximum at or below it, and rescales the row's
// context, sum and the probabilities already written in this tile (columns
// [0, c)) by 2^-k, exactly.
void MoveReference(const TileRows& st, int64_t r, int64_t c, const float* scores, int64_t count);

// The row's sum: its 16 lanes added up.
float SumLanes(const float* lanes);

}  // namespace attention::fused_internal

#endif  // ATTENTION_CORE_FUSED_SOFTMAX_H_
