#include "core/kv_cache.h"

namespace attention {

size_t KvCache::BlockBytes(int64_t heads, int64_t head_dim, DType dtype) {
  return static_cast<size_t>(2 * heads * head_dim * kBlockTokens) * DTypeSize(dtype);
}

KvCache::KvCache(KvBlockPool* pool, int64_t heads, int64_t head_dim, DType dtype)
    : pool_(pool), heads_(heads), head_dim_(head_dim), dtype_(dtype) {}

KvCache::~KvCache() { pool_->Free(blocks_.data(), blocks_.size()); }

absl::Status KvCache::Reserve(int64_t tokens) {
  const int64_t needed = (length_ + tokens + kBlockTokens - 1) / kBlockTokens;
  const int64_t missing = needed - static_cast<int64_t>(blocks_.size());
  if (missing <= 0) return absl::OkStatus();
  const absl::Status status = pool_->Allocate(missing, &blocks_);
  if (status.ok()) key_bias_.resize(static_cast<size_t>(capacity()));
  return status;
}

void KvCache::Store(int64_t pos, const float* k, const float* v, float key_bias) {
  const int64_t b = pos / kBlockTokens, t = pos % kBlockTokens;
  const size_t esize = DTypeSize(dtype_);
  for (int64_t h = 0; h < heads_; ++h) {
    char* keys = static_cast<char*>(const_cast<void*>(Keys(b, h)));
    char* values = static_cast<char*>(const_cast<void*>(Values(b, h)));
    const float* kh = k + h * head_dim_;
    for (int64_t d = 0; d < head_dim_; ++d) {
      ConvertFloats(DType::kFloat32, kh + d, dtype_, keys + (d * kBlockTokens + t) * esize, 1);
    }
    ConvertFloats(DType::kFloat32, v + h * head_dim_, dtype_, values + t * head_dim_ * esize,
                  static_cast<size_t>(head_dim_));
  }
  key_bias_[static_cast<size_t>(pos)] = key_bias;
}

void KvCache::Commit(int64_t length) { length_ = length; }

void KvCache::Shrink() {
  const size_t keep = static_cast<size_t>((length_ + kBlockTokens - 1) / kBlockTokens);
  if (keep >= blocks_.size()) return;
  pool_->Free(blocks_.data() + keep, blocks_.size() - keep);
  blocks_.resize(keep);
  key_bias_.resize(static_cast<size_t>(capacity()));
}

const void* KvCache::Keys(int64_t b, int64_t h) const {
  const size_t plane = static_cast<size_t>(2 * head_dim_ * kBlockTokens) * DTypeSize(dtype_);
  return static_cast<const char*>(blocks_[static_cast<size_t>(b)]) + h * plane;
}

const void* KvCache::Values(int64_t b, int64_t h) const {
  const size_t half = static_cast<size_t>(head_dim_ * kBlockTokens) * DTypeSize(dtype_);
  return static_cast<const char*>(Keys(b, h)) + half;
}

}  // namespace attention
