#include "core/fused_attention.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/avx512_tiles.h"
#include "core/fused_attention_pack.h"
#include "core/fused_score_exp.h"
#include "core/fused_softmax.h"
#include "core/workspace.h"

namespace attention {
namespace {

using fused_internal::AnyNonFinite;
using fused_internal::Element;
using fused_internal::LoadRow;
using fused_internal::PackBFloat16;
using fused_internal::PackFloat32;
using fused_internal::ScoresExp;
using fused_internal::SoftmaxTile;
using fused_internal::StoreRow;
using fused_internal::SumLanes;
using fused_internal::TileRows;

constexpr int64_t kRowTile = 64;   // Query rows per task.
constexpr int64_t kKeyTile = 256;  // Keys per inner step (scores: 64 x 256 x 4 = 64 KiB).
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Scores are kept in log2 units (Q is scaled by log2(e), masks likewise), so
// that the softmax takes 2^x.
constexpr float kLog2e = 1.44269504088896341f;
using avx512::kPanel;

int64_t RoundUp16(int64_t x) { return (x + 15) / 16 * 16; }

// One thread's tiles, reused across calls (grown, never shrunk: bounded by
// the tile sizes times the head depth).
struct Scratch {
  std::vector<float> q, s, o, m, alpha;
  std::vector<float> sums;       // Per row, 16 lanes of its running sum.
  std::vector<uint32_t> qw, pw;  // bfloat16 pairs of Q and of P (bfloat16 mode).
  static void Fit(std::vector<float>* buffer, int64_t n) {
    if (static_cast<int64_t>(buffer->size()) < n) buffer->resize(static_cast<size_t>(n));
  }
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// row[j] += mask[j] log2(e) for j < count, bool true -> -inf (added: NaN
// stays NaN).
void AddMask(DType dtype, const void* mask, int64_t count, float* row) {
  if (dtype == DType::kBool) {
    const uint8_t* m = static_cast<const uint8_t*>(mask);
    for (int64_t j = 0; j < count; ++j) row[j] += m[j] ? kNegInf : 0.0f;
  } else if (dtype == DType::kFloat32) {
    const float* m = static_cast<const float*>(mask);
    for (int64_t j = 0; j < count; ++j) row[j] += m[j] * kLog2e;
  } else {
    for (int64_t j = 0; j < count; ++j) row[j] += LoadAsFloat(dtype, mask, j) * kLog2e;
  }
}

// Everything one task needs to know about its item and head.
struct Task {
  const AttentionProblem* p;
  const ItemMask* item;
  const float* key_row;  // The item's additive (S') key mask, or null.
  // This item and head's K^T as panels (avx512::kPanel keys each, `k_rows`
  // rows of float32 features or of bfloat16 feature-pair words): the main
  // keys' panels, then the appended keys' panel.
  const void* kt;
  int64_t k_rows;
  int64_t appended_panel;  // Index of the appended keys' panel.
  // V: float32 rows `ldv` apart; in bfloat16 mode rows of key pairs (ldv
  // words each), the main keys' pairs, then the appended keys' pairs from
  // row `appended_pairs`.
  const void* v;
  int64_t ldv;
  bool bf16 = false;
  int64_t appended_pairs = 0;
  int64_t n, h, r0, rows;
  // is_causal: every key tile is computed, not only those up to the tile's
  // last row (a NaN or infinite key or value after a row reaches it through
  // the additive causal mask, as in PyTorch).
  bool all_keys = false;
};

// A tile that a mask touches (its scores in w.s): masks added, then the
// softmax step over the stored scores, and the rows' contexts rescaled.
void MaskedSoftmax(const Task& t, int64_t c0, int64_t keys, bool appended, Scratch& w) {
  const ItemMask& item = *t.item;
  const int64_t ldq = RoundUp16(t.p->q.d), lds = RoundUp16(keys);
  float* s = w.s.data();
  for (int64_t r = 0; r < t.rows; ++r) {
    float* sr = s + r * lds;
    const int64_t i = t.r0 + r;
    // Padded query rows need only finite garbage: no attn_mask, no causal.
    const bool own_row = !appended && i < item.valid_queries;
    // Keys [0, visible) get the masks; under is_causal the later ones get
    // -inf instead (the causal mask replaces the others there), added to the
    // score so that a NaN one stays NaN.
    const int64_t visible =
        own_row && item.is_causal ? std::clamp<int64_t>(i + 1 - c0, 0, keys) : keys;
    if (t.key_row != nullptr) {
      for (int64_t j = 0; j < visible; ++j) sr[j] += t.key_row[c0 + j] * kLog2e;
    }
    if (own_row && item.attn_mask != nullptr) {
      const int64_t plane = item.valid_queries * item.valid_keys;
      const int64_t offset = (item.attn_mask_per_head ? t.h * plane : 0) + i * item.valid_keys + c0;
      AddMask(item.attn_mask_dtype,
              static_cast<const char*>(item.attn_mask) +
                  offset * static_cast<int64_t>(DTypeSize(item.attn_mask_dtype)),
              visible, sr);
    }
    // sr[j] += -inf for j in [visible, keys), a vector at a time.
    for (int64_t j = visible / 16 * 16; j < keys; j += 16) {
      const __mmask16 hidden =
          static_cast<__mmask16>(avx512::TailMask(keys - j) & ~avx512::TailMask(visible - j));
      const __m512 x = _mm512_loadu_ps(sr + j);
      _mm512_mask_storeu_ps(sr + j, hidden, _mm512_add_ps(x, _mm512_set1_ps(kNegInf)));
    }
  }
  // bfloat16 mode: the probabilities as bfloat16 pairs of keys.
  SoftmaxTile(s, lds, t.rows, keys, t.bf16 ? w.pw.data() : nullptr, kKeyTile / 2 + 1, w.m.data(),
              w.sums.data(), w.alpha.data());
  for (int64_t r = 0; r < t.rows; ++r) {
    const float alpha = w.alpha[r];
    if (alpha != 1.0f) {
      float* o = w.o.data() + r * ldq;
      for (int64_t d = 0; d < ldq; ++d) o[d] *= alpha;
    }
  }
}

// One tile of keys [c0, c0 + keys): scores, masks, online softmax, P V.
// `appended` marks the appended bias_kv / zero_attn keys (only the key mask
// row applies to them).
void KeyTile(const Task& t, int64_t c0, int64_t keys, bool appended, Scratch& w) {
  const AttentionProblem& p = *t.p;
  const ItemMask& item = *t.item;
  const int64_t depth = p.q.d, ldq = RoundUp16(depth), lds = RoundUp16(keys);
  const int64_t depth_pairs = (depth + 1) / 2, key_pairs = (keys + 1) / 2;
  const int64_t panel = appended ? t.appended_panel : c0 / kPanel;
  const uint32_t* kt2 = static_cast<const uint32_t*>(t.kt) + panel * t.k_rows * kPanel;
  const float* kt = static_cast<const float*>(t.kt) + panel * t.k_rows * kPanel;
  float* s = w.s.data();
  const int64_t ldp = kKeyTile / 2 + 1;  // bfloat16 mode: words of probability pairs per row.
  // No mask touches the tile but maybe the causal one: scores and
  // probabilities in one pass, the causal mask applied in registers. (It
  // also hides keys from the tile's padded query rows, which need only
  // finite values: each sees its first key.)
  const bool own_rows = !appended && t.r0 < item.valid_queries;
  const bool unmasked = t.key_row == nullptr && !(own_rows && item.attn_mask != nullptr);
  const int64_t diagonal =
      own_rows && item.is_causal && c0 + keys - 1 > t.r0 ? t.r0 - c0 : fused_internal::kNoDiagonal;
  if (unmasked) {
    const TileRows rows{w.m.data(),           w.sums.data(),
                        w.o.data(),           ldq,
                        t.bf16 ? nullptr : s, t.bf16 ? w.pw.data() : nullptr,
                        t.bf16 ? ldp : lds,   /*exact=*/!t.bf16};
    if (t.bf16) {
      ScoresExp(w.qw.data(), depth_pairs, kt2, depth_pairs, t.rows, keys, rows, diagonal);
    } else {
      ScoresExp(w.q.data(), ldq, kt, depth, t.rows, keys, rows, diagonal);
    }
  } else {
    if (t.bf16) {
      avx512::Scores(w.qw.data(), depth_pairs, kt2, depth_pairs, t.rows, keys, s, lds);
    } else {
      avx512::Scores(w.q.data(), ldq, kt, depth, t.rows, keys, s, lds);
    }
    MaskedSoftmax(t, c0, keys, appended, w);
  }
  if (!t.bf16) {
    const float* v = static_cast<const float*>(t.v) + c0 * t.ldv;
    avx512::Context(s, lds, v, t.ldv, t.rows, keys, depth, w.o.data(), ldq);
    return;
  }
  const int64_t pair_row = appended ? t.appended_pairs : c0 / 2;
  const uint32_t* v = static_cast<const uint32_t*>(t.v) + pair_row * t.ldv;
  avx512::Context(w.pw.data(), ldp, v, t.ldv, t.rows, key_pairs, depth, w.o.data(), ldq);
}

void RunTask(const Task& t) {
  const AttentionProblem& p = *t.p;
  const int64_t depth = p.q.d, ldq = RoundUp16(depth);
  Scratch& w = ThreadScratch();
  Scratch::Fit(&w.q, kRowTile * ldq);
  Scratch::Fit(&w.s, kRowTile * kKeyTile);
  Scratch::Fit(&w.o, kRowTile * ldq);
  Scratch::Fit(&w.m, kRowTile);
  Scratch::Fit(&w.alpha, kRowTile);
  Scratch::Fit(&w.sums, kRowTile * 16);
  for (int64_t r = 0; r < t.rows; ++r) {
    LoadRow(p.q.dtype, Element(p.q, t.n, t.h, t.r0 + r), depth, p.scale * kLog2e,
            w.q.data() + r * ldq);
  }
  if (t.bf16) {
    const int64_t depth_pairs = (depth + 1) / 2;
    if (static_cast<int64_t>(w.qw.size()) < kRowTile * depth_pairs) {
      w.qw.resize(static_cast<size_t>(kRowTile * depth_pairs));
    }
    if (w.pw.size() < static_cast<size_t>(kRowTile * (kKeyTile / 2 + 1))) {
      w.pw.resize(static_cast<size_t>(kRowTile * (kKeyTile / 2 + 1)));
    }
    for (int64_t r = 0; r < t.rows; ++r) {
      avx512::ToBf16Pairs(w.q.data() + r * ldq, depth, w.qw.data() + r * depth_pairs);
    }
  }
  std::fill_n(w.o.data(), t.rows * ldq, 0.0f);
  std::fill_n(w.m.data(), t.rows, kNegInf);
  std::fill_n(w.sums.data(), t.rows * 16, 0.0f);

  // The item's own keys, up to its valid length (the batch padding after it
  // is wholly masked) and, under is_causal, up to the tile's last row.
  const ItemMask& item = *t.item;
  const int64_t keys = t.p->masks->keys();
  int64_t end = std::min(item.valid_keys, keys);
  // Under is_causal a NaN or infinite query row computes every key tile too:
  // its scores on the keys after its own are NaN or +inf, which the additive
  // causal mask leaves NaN, as in PyTorch (a row its masks hide wholly is
  // then NaN, not zeros).
  if (item.is_causal && !t.all_keys &&
      !fused_internal::AnyNonFiniteRows(w.q.data(), std::min(t.rows, item.valid_queries - t.r0),
                                        ldq, depth)) {
    end = std::min(end, t.r0 + t.rows);
  }
  // Under is_causal the mask touches only the keys from the tile's first row
  // on: those get tiles of their own, the ones before run unmasked.
  const int64_t unmasked_end = item.is_causal ? std::min(end, t.r0) : end;
  // The output rows' lines fetched during the last key tile (a tile's worth
  // of compute hides their misses; StoreRow then hits).
  const int64_t out_bytes = depth * static_cast<int64_t>(DTypeSize(p.out.dtype));
  const auto tile = [&](int64_t c0, int64_t count, bool appended) {
    if (p.k.t > keys ? appended : c0 + count >= end) {
      for (int64_t r = 0; r < t.rows; ++r)
        fused_internal::PrefetchBytes(Element(p.out, t.n, t.h, t.r0 + r), out_bytes, true);
    }
    KeyTile(t, c0, count, appended, w);
  };
  for (int64_t c0 = 0; c0 < unmasked_end; c0 += kKeyTile) {
    tile(c0, std::min(kKeyTile, unmasked_end - c0), /*appended=*/false);
  }
  for (int64_t c0 = unmasked_end; c0 < end; c0 += kKeyTile) {
    tile(c0, std::min(kKeyTile, end - c0), /*appended=*/false);
  }
  if (p.k.t > keys) tile(keys, p.k.t - keys, /*appended=*/true);

  // out = O / l; a row with a NaN score (l NaN) gets NaN. Every score -inf
  // (l == 0): zeros (O is 0 * V) when the masks hide every key, as on the
  // primitive path; otherwise the -inf came from the inputs and the row is
  // NaN, as in PyTorch. (Padded query rows stay finite.)
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (int64_t r = 0; r < t.rows; ++r) {
    const float l = SumLanes(w.sums.data() + 16 * r);
    const int64_t i = t.r0 + r;
    float scale = 1.0f / l;
    if (l == 0.0f) {
      scale = i >= item.valid_queries || p.masks->RowFullyMasked(t.n, t.h, i) ? 0.0f : kNaN;
    }
    StoreRow(w.o.data() + r * ldq, depth, scale, p.out.dtype,
             const_cast<char*>(Element(p.out, t.n, t.h, i)));
  }
}

bool CpuHasAvx512Bf16() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return has;
}

bool CpuHasAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

}  // namespace

int64_t FusedKeyPanelBytes(int64_t planes, int64_t depth, int64_t main_keys, int64_t total_keys) {
  const int64_t panels = (main_keys + kPanel - 1) / kPanel + (total_keys > main_keys ? 1 : 0);
  return planes * depth * panels * kPanel * static_cast<int64_t>(sizeof(float));
}

bool FusedAttentionFits(int64_t planes, int64_t depth, int64_t main_keys, int64_t total_keys) {
  const int64_t panels = FusedKeyPanelBytes(planes, depth, main_keys, total_keys);
  const int64_t dense =
      planes * depth * RoundUp16(total_keys) * static_cast<int64_t>(sizeof(float));
  return panels <= 2 * dense || panels <= (int64_t{8} << 20);
}

bool FusedAttentionAvailable() {
  static const bool available = [] {
    const char* env = std::getenv("ATTENTION_FUSED_ATTENTION");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    return CpuHasAvx512();
  }();
  return available;
}

const char* AttentionPathName() {
  return FusedAttentionAvailable() ? "fused-avx512" : "onednn-primitives";
}

absl::Status RunFusedAttention(const AttentionProblem& p) {
  if (!FusedAttentionAvailable() || p.weights != nullptr) {
    return absl::FailedPreconditionError(
        "fused attention: needs AVX-512 and a call without attention weights");
  }
  const MaskPlan& plan = *p.masks;
  const int64_t n = p.q.n, heads = p.q.h, queries = p.q.t, keys = p.k.t, depth = p.q.d;
  const int64_t ldq = RoundUp16(depth);
  const int64_t planes = n * heads;

  // Packed once per call, for every query tile: K^T per item and head as
  // panels of kPanel keys, and V as dense rows (read in place, heads 3E apart
  // map onto a handful of L1 sets and thrash). Zero-padded.
  const bool bf16 = p.q.dtype == DType::kBFloat16 && p.k.dtype == DType::kBFloat16 &&
                    p.v.dtype == DType::kBFloat16 && CpuHasAvx512Bf16();
  const int64_t main_keys = plan.keys();
  const int64_t main_pairs = (main_keys + 1) / 2,
                pair_rows = main_pairs + (keys - main_keys + 1) / 2;
  const int64_t main_panels = (main_keys + kPanel - 1) / kPanel;
  const int64_t k_rows = bf16 ? (depth + 1) / 2 : depth;  // Rows of each K^T panel.
  const int64_t k_words = (main_panels + (keys > main_keys ? 1 : 0)) * k_rows * kPanel;
  const int64_t v_rows = bf16 ? pair_rows : keys;  // Rows of V per plane.
  Workspace kt_buffer(Workspace::kKernelKeys, static_cast<size_t>(planes * k_words) * 4);
  Workspace v_buffer(Workspace::kKernelValues, static_cast<size_t>(planes * v_rows * ldq) * 4);
  // is_causal planes whose keys or values hold a NaN or infinity: every row
  // computes every key tile (see Task::all_keys).
  std::vector<uint8_t> all_keys(static_cast<size_t>(planes), 0);
#pragma omp parallel for schedule(static) if (planes * depth * keys > (1 << 16))
  for (int64_t plane = 0; plane < planes; ++plane) {
    char* k_dst = kt_buffer.as<char>() + plane * k_words * 4;
    char* v_dst = v_buffer.as<char>() + plane * v_rows * ldq * 4;
    if (bf16) {
      PackBFloat16(p, plane / heads, plane % heads, main_keys, ldq,
                   reinterpret_cast<uint32_t*>(k_dst), reinterpret_cast<uint32_t*>(v_dst));
    } else {
      PackFloat32(p, plane / heads, plane % heads, main_keys, ldq, reinterpret_cast<float*>(k_dst),
                  reinterpret_cast<float*>(v_dst));
    }
    if (plan.item(plane / heads).is_causal) {
      all_keys[static_cast<size_t>(plane)] =
          AnyNonFinite(reinterpret_cast<const uint32_t*>(k_dst), k_words, bf16) ||
          AnyNonFinite(reinterpret_cast<const uint32_t*>(v_dst), v_rows * ldq, bf16);
    }
  }

  const int64_t row_tiles = (queries + kRowTile - 1) / kRowTile;
  const int64_t tasks = planes * row_tiles;
  const bool key_rows = plan.mode() != MaskMode::kNone;
#pragma omp parallel for schedule(dynamic, 1) if (tasks > 1)
  for (int64_t idx = 0; idx < tasks; ++idx) {
    Task t;
    t.p = &p;
    const int64_t plane = idx / row_tiles;
    t.n = plane / heads;
    t.h = plane % heads;
    // The last rows first: under is_causal they have the most keys, and the
    // short tasks at the end keep both threads busy to the last.
    t.r0 = (row_tiles - 1 - idx % row_tiles) * kRowTile;
    t.rows = std::min(kRowTile, queries - t.r0);
    t.item = &plan.item(t.n);
    // The item's key row holds its key padding mask, -inf past its valid
    // keys (never visited: see RunTask) and 0 for appended keys: needed only
    // with a key padding mask.
    t.key_row = key_rows && t.item->key_padding != nullptr
                    ? plan.key_rows() + t.n * plan.total_keys()
                    : nullptr;
    if (t.r0 >= t.item->valid_queries) {
      // Batch padding rows: nothing to compute, but keep them finite.
      for (int64_t r = 0; r < t.rows; ++r) {
        char* dst = const_cast<char*>(Element(p.out, t.n, t.h, t.r0 + r));
        std::memset(dst, 0, static_cast<size_t>(depth) * DTypeSize(p.out.dtype));
      }
      continue;
    }
    t.kt = kt_buffer.as<char>() + plane * k_words * 4;
    t.k_rows = k_rows;
    t.appended_panel = main_panels;
    t.v = v_buffer.as<char>() + plane * v_rows * ldq * 4;
    t.ldv = ldq;
    t.bf16 = bf16;
    t.appended_pairs = main_pairs;
    t.all_keys = all_keys[static_cast<size_t>(plane)] != 0;
    RunTask(t);
  }
  return absl::OkStatus();
}

}  // namespace attention
