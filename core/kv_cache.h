// File: core/kv_cache.h
//
// KvCache holds one session's projected keys and values, per head, in
// fixed-size blocks of kBlockTokens tokens from a KvBlockPool (paged, as
// vLLM's cache is). In a block, each head keeps its keys transposed,
// K^T (head_dim, kBlockTokens), followed by its values V (kBlockTokens,
// head_dim), so that scoring a block against one query row and summing its
// values are both runs of contiguous kBlockTokens- or head_dim-wide vectors.
// Each token also has an additive key bias: 0, or -inf for a token that is
// stored but never attended to ("not a key").
//
// Lifecycle of an append: Reserve(T) takes blocks for T more tokens (all or
// nothing), Store() writes them, Commit() makes them part of the session;
// until Commit the session's length is unchanged, so a failed append leaves
// it as it was.
//
// Not thread-safe: one session's appends are serialised by its owner. The
// cache owns its blocks and returns them to the pool when destroyed or
// shrunk; the pool must outlive it.
#ifndef ATTENTION_CORE_KV_CACHE_H_
#define ATTENTION_CORE_KV_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "core/kv_block_pool.h"

namespace attention {

class KvCache {
 public:
  static constexpr int64_t kBlockTokens = 16;

  // Bytes of one block for `heads` x `head_dim` in `dtype` (float32 or bfloat16).
  static size_t BlockBytes(int64_t heads, int64_t head_dim, DType dtype);

  KvCache(KvBlockPool* pool, int64_t heads, int64_t head_dim, DType dtype);
  ~KvCache();

  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int64_t length() const { return length_; }
  int64_t capacity() const { return static_cast<int64_t>(blocks_.size()) * kBlockTokens; }
  size_t bytes() const { return blocks_.size() * pool_->block_bytes(); }
  DType dtype() const { return dtype_; }
  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return head_dim_; }

  // Makes room for `tokens` tokens past length(); ResourceExhausted (and no
  // change) when the pool cannot give the blocks.
  absl::Status Reserve(int64_t tokens);
  // Writes token `pos` (length() <= pos < capacity()): `k` and `v` are
  // heads x head_dim float32 each (head-major, as a projection gives them).
  void Store(int64_t pos, const float* k, const float* v, float key_bias);
  // The first `length` tokens (>= length(), <= capacity()) are the session's.
  void Commit(int64_t length);
  // Returns blocks past what length() needs to the pool.
  void Shrink();

  // Head `h`'s K^T (head_dim, kBlockTokens) and V (kBlockTokens, head_dim)
  // in block `b`, of dtype().
  const void* Keys(int64_t b, int64_t h) const;
  const void* Values(int64_t b, int64_t h) const;
  // Additive key bias of each stored token (capacity() entries).
  const float* key_bias() const { return key_bias_.data(); }

 private:
  KvBlockPool* const pool_;
  const int64_t heads_, head_dim_;
  const DType dtype_;
  std::vector<void*> blocks_;
  std::vector<float> key_bias_;
  int64_t length_ = 0;
};

}  // namespace attention

#endif  // ATTENTION_CORE_KV_CACHE_H_
