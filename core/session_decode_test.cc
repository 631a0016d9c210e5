// The AVX-512 decode kernel (session_decode.h) with its merge
// (session_attention.h) against the reference kernel, AttendSessionRow, on
// the same caches: float32 and bfloat16 caches, head dims 16..128, lengths
// around block edges, split counts, key biases (0, -inf, finite), fully
// masked rows, NaNs in q, K and V, add_bias_kv and add_zero_attn. Ordinary
// rows agree within |new - ref| <= 1e-5 (1 + |ref|) with NaN in the same
// places; rows the merge hands back to the reference (fully masked, a NaN
// score) are bit-identical to it.
#include "core/session_decode.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "core/memory_budget.h"
#include "core/session_attention.h"
#include "core/session_kernel.h"
#include "gtest/gtest.h"

namespace attention {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// kRising: biases growing along the cache, so the kernel's reference moves often.
enum class Bias { kZero, kSomeMasked, kFinite, kRising, kAllMasked };
enum class Poison { kNone, kNaNQuery, kNaNKey, kNaNValue, kNaNMaskedValue };

struct DecodeCase {
  DType dtype = DType::kFloat32;
  int64_t heads = 2, d = 32, length = 17;
  Bias bias = Bias::kZero;
  Poison poison = Poison::kNone;
  bool bias_kv = false, zero_attn = false;
};

class Fixture {
 public:
  explicit Fixture(const DecodeCase& s)
      : s_(s),
        budget_(size_t{1} << 30),
        pool_(KvCache::BlockBytes(s.heads, s.d, s.dtype), &budget_),
        cache_(&pool_, s.heads, s.d, s.dtype) {
    std::mt19937 rng(static_cast<unsigned>(s.d * 7919 + s.length));
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
    const int64_t e = s.heads * s.d;
    // Stored tokens past the row's keys (the rest of the last block) hold
    // NaN keys and values and a 0 bias: the row must not see them.
    const int64_t garbage = 5;
    EXPECT_TRUE(cache_.Reserve(s.length + garbage).ok());
    std::vector<float> k(static_cast<size_t>(e)), v(static_cast<size_t>(e));
    for (int64_t pos = 0; pos < s.length + garbage; ++pos) {
      for (float& x : k) x = pos < s.length ? normal(rng) : kNaN;
      for (float& x : v) x = pos < s.length ? normal(rng) : kNaN;
      float bias = 0.0f;
      if (s.bias == Bias::kAllMasked || (s.bias == Bias::kSomeMasked && pos % 3 == 1)) bias = -kInf;
      if (s.bias == Bias::kFinite) bias = uniform(rng);
      if (s.bias == Bias::kRising) bias = 0.03f * static_cast<float>(pos) - 20.0f;
      if (pos == s.length / 2) {  // In every head.
        for (int64_t h = 0; h < s.heads; ++h) {
          if (s.poison == Poison::kNaNKey) k[static_cast<size_t>(h * s.d + 1)] = kNaN;
          if (s.poison == Poison::kNaNValue || s.poison == Poison::kNaNMaskedValue) {
            v[static_cast<size_t>(h * s.d + 3)] = kNaN;
          }
        }
        if (s.poison == Poison::kNaNMaskedValue) bias = -kInf;
      }
      cache_.Store(pos, k.data(), v.data(), bias);
    }
    cache_.Commit(s.length + garbage);
    // Queries with the engine's 1/sqrt(head_dim) scale, twice as large as
    // unit-variance ones would be: scores of standard deviation 2, so that
    // the softmax is far from uniform (probabilities spanning ~e^12) while
    // float32 rounding of the scores themselves stays below the tolerance.
    q_.resize(static_cast<size_t>(e));
    for (float& x : q_) x = normal(rng) * 2.0f / std::sqrt(static_cast<float>(s.d));
    for (int64_t h = 0; h < s.heads && s.poison == Poison::kNaNQuery; ++h) {
      q_[static_cast<size_t>(h * s.d + 2)] = kNaN;
    }
    if (s.bias_kv) {
      bias_k_.resize(static_cast<size_t>(e));
      bias_v_.resize(static_cast<size_t>(e));
      for (float& x : bias_k_) x = normal(rng);
      for (float& x : bias_v_) x = normal(rng);
      extras_.bias_k = bias_k_.data();
      extras_.bias_v = bias_v_.data();
    }
    extras_.zero_attn = s.zero_attn;
  }

  AttentionRow Row(float* context) const {
    AttentionRow row;
    row.cache = &cache_;
    row.keys = row.stored = s_.length;
    row.q = q_.data();
    row.context = context;
    return row;
  }

  std::vector<float> Reference() const {
    std::vector<float> out(q_.size());
    for (int64_t h = 0; h < s_.heads; ++h) {
      SessionRow r;
      r.cache = &cache_;
      r.head = h;
      r.keys = r.stored = s_.length;
      r.q = q_.data() + h * s_.d;
      if (extras_.bias_k != nullptr) {
        r.bias_k = extras_.bias_k + h * s_.d;
        r.bias_v = extras_.bias_v + h * s_.d;
      }
      r.zero_attn = extras_.zero_attn;
      r.context = out.data() + h * s_.d;
      AttendSessionRow(r);
    }
    return out;
  }

  // The decode kernel over `splits` ranges of whole blocks, then the merge.
  std::vector<float> Decode(int64_t splits) const {
    const int64_t stride = DecodePartialStride(s_.d);
    std::vector<float> storage(static_cast<size_t>(splits * s_.heads * stride + 16));
    float* partials = storage.data();
    while (reinterpret_cast<uintptr_t>(partials) % 64 != 0) ++partials;
    const int64_t nb = (s_.length + KvCache::kBlockTokens - 1) / KvCache::kBlockTokens;
    for (int64_t i = 0; i < splits; ++i) {
      DecodeRange r;
      r.cache = &cache_;
      r.begin = nb * i / splits * KvCache::kBlockTokens;
      r.end = std::min(s_.length, nb * (i + 1) / splits * KvCache::kBlockTokens);
      r.q = q_.data();
      r.partial = partials + i * s_.heads * stride;
      DecodeRangeAvx512(r);
    }
    std::vector<float> out(q_.size(), -1.0f);
    const AttentionRow row = Row(out.data());
    for (int64_t h = 0; h < s_.heads; ++h) MergeDecodePartials(partials, splits, row, h, extras_);
    return out;
  }

  std::vector<float> Rows(SessionKernel kernel) const {
    std::vector<float> out(q_.size(), -1.0f);
    AttendRows({Row(out.data())}, extras_, kernel);
    return out;
  }

  const KvCache& cache() const { return cache_; }

 private:
  const DecodeCase s_;
  MemoryBudget budget_;
  KvBlockPool pool_;
  KvCache cache_;
  std::vector<float> q_, bias_k_, bias_v_;
  AttentionExtras extras_;
};

void ExpectClose(const std::vector<float>& ref, const std::vector<float>& got,
                 const std::string& what) {
  ASSERT_EQ(ref.size(), got.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ref[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " [" << i << "]: expected NaN, got " << got[i];
    } else {
      EXPECT_LE(std::fabs(got[i] - ref[i]), 1e-5f * (1.0f + std::fabs(ref[i])))
          << what << " [" << i << "]: expected " << ref[i] << ", got " << got[i];
    }
  }
}

void ExpectIdentical(const std::vector<float>& ref, const std::vector<float>& got,
                     const std::string& what) {
  ASSERT_EQ(ref.size(), got.size());
  EXPECT_EQ(std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)), 0) << what;
}

std::string Name(const DecodeCase& s, int64_t splits) {
  return std::string(DTypeName(s.dtype)) + " d=" + std::to_string(s.d) +
         " length=" + std::to_string(s.length) + " splits=" + std::to_string(splits) +
         " bias=" + std::to_string(static_cast<int>(s.bias)) +
         " poison=" + std::to_string(static_cast<int>(s.poison)) + (s.bias_kv ? " bias_kv" : "") +
         (s.zero_attn ? " zero_attn" : "");
}

bool Supported() {
  DecodeCase s;
  return DecodeSupports(Fixture(s).cache());
}

TEST(SessionDecode, MatchesReferenceAcrossDtypesHeadDimsLengthsAndSplits) {
  if (!Supported()) GTEST_SKIP() << "no AVX-512";
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int64_t d : {16, 32, 64, 128}) {
      for (int64_t length : {1, 15, 16, 17, 1000, 2049}) {
        for (Bias bias : {Bias::kZero, Bias::kSomeMasked, Bias::kFinite, Bias::kRising}) {
          DecodeCase s;
          s.dtype = dtype, s.d = d, s.length = length, s.bias = bias;
          const Fixture f(s);
          const std::vector<float> ref = f.Reference();
          for (int64_t splits : {1, 2, 3, 7}) ExpectClose(ref, f.Decode(splits), Name(s, splits));
          ExpectClose(ref, f.Rows(SessionKernel::kDecode), Name(s, 0) + " AttendRows");
        }
      }
    }
  }
}

TEST(SessionDecode, ExtraKeysJoinTheMerge) {
  if (!Supported()) GTEST_SKIP() << "no AVX-512";
  for (bool bias_kv : {false, true}) {
    for (bool zero_attn : {false, true}) {
      for (Bias bias : {Bias::kZero, Bias::kAllMasked}) {
        DecodeCase s;
        s.length = 300, s.bias_kv = bias_kv, s.zero_attn = zero_attn, s.bias = bias;
        const Fixture f(s);
        const std::vector<float> ref = f.Reference();
        for (int64_t splits : {1, 3}) ExpectClose(ref, f.Decode(splits), Name(s, splits));
      }
    }
  }
}

TEST(SessionDecode, EdgeRowsAreTheReferenceExactly) {
  if (!Supported()) GTEST_SKIP() << "no AVX-512";
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int64_t length : {1, 17, 1000}) {
      DecodeCase masked;
      masked.dtype = dtype, masked.length = length, masked.bias = Bias::kAllMasked;
      for (Poison poison : {Poison::kNone, Poison::kNaNValue}) {
        masked.poison = poison;
        const Fixture f(masked);
        const std::vector<float> ref = f.Reference();
        for (int64_t splits : {1, 2, 7})
          ExpectIdentical(ref, f.Decode(splits), Name(masked, splits));
      }
      for (Poison poison : {Poison::kNaNQuery, Poison::kNaNKey}) {
        DecodeCase s;
        s.dtype = dtype, s.length = length, s.poison = poison, s.bias = Bias::kSomeMasked;
        const Fixture f(s);
        const std::vector<float> ref = f.Reference();
        for (int64_t splits : {1, 2, 7}) ExpectIdentical(ref, f.Decode(splits), Name(s, splits));
      }
    }
  }
}

TEST(SessionDecode, NaNValuesStayInTheirFeatures) {
  if (!Supported()) GTEST_SKIP() << "no AVX-512";
  for (Poison poison : {Poison::kNaNValue, Poison::kNaNMaskedValue}) {
    for (int64_t length : {17, 1000}) {
      DecodeCase s;
      s.length = length, s.poison = poison, s.bias = Bias::kFinite;
      const Fixture f(s);
      const std::vector<float> ref = f.Reference();
      int nans = 0;
      for (float x : ref) nans += std::isnan(x);
      EXPECT_EQ(nans, 2) << "one feature of each head";  // The test's own premise.
      for (int64_t splits : {1, 2, 7}) ExpectClose(ref, f.Decode(splits), Name(s, splits));
    }
  }
}

TEST(SessionDecode, HeadDimsItDoesNotTakeUseTheReference) {
  DecodeCase s;
  s.d = 24, s.length = 100;
  const Fixture f(s);
  EXPECT_FALSE(DecodeSupports(f.cache()));
  ExpectIdentical(f.Reference(), f.Rows(SessionKernel::kDecode), "d=24");
  DecodeCase t;
  t.length = 100;
  const Fixture g(t);
  ExpectIdentical(g.Reference(), g.Rows(SessionKernel::kReference), "kReference");
}

TEST(SessionDecode, SplitsFollowTheBatch) {
  EXPECT_EQ(DecodeSplits(2048, 64, 2), 1);
  EXPECT_EQ(DecodeSplits(2048, 1, 2), 8);
  EXPECT_EQ(DecodeSplits(2048, 3, 2), 3);
  EXPECT_EQ(DecodeSplits(100, 1, 2), 1);  // 7 blocks: too short to split.
  EXPECT_EQ(DecodeSplits(0, 1, 2), 1);
  for (int64_t rows : {1, 2, 5, 17, 64, 300}) {
    EXPECT_LE(rows * DecodeSplits(1 << 20, rows, 64), rows + kMaxSplitTasks) << rows;
  }
}

}  // namespace
}  // namespace attention
