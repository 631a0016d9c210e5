// File: core/fused_attention.h
//
// A fused (flash-style) attention kernel for AVX-512 CPUs: for each batch
// item, head and tile of query rows, it loops over tiles of keys computing
// Q K^T, applying the masks inside the tile, updating an online softmax
// (running max and sum, rescaling) and accumulating P V, so that no score
// matrix larger than one tile per thread is ever written. Key padding and
// is_causal come from indices; only an explicit attn_mask is read from
// memory. Key tiles that are wholly masked are skipped: those past an item's
// valid keys (batch padding) and, under is_causal, those after the tile's
// last query row (about half of them).
//
// Semantics are RunAttention's (attention_kernel.h): a fully masked row gives
// a zero context, NaN propagates as in PyTorch (under is_causal, a plane whose
// keys or values hold a NaN or infinity computes every key tile: the skipped
// ones would reach the earlier rows through the additive mask); appended
// bias_kv / zero_attn keys are always attendable.
// float32 or bfloat16 inputs (bfloat16 is widened to float32 in the tile);
// softmax and accumulation in float32. It does not produce attention weights.
//
// Thread safety: safe to call from several threads at once. It parallelises
// over (item, head, query tile) on the calling thread's OpenMP team; each
// thread's tiles live in thread-local buffers that are reused across calls
// (no allocation in steady state).
#ifndef ATTENTION_CORE_FUSED_ATTENTION_H_
#define ATTENTION_CORE_FUSED_ATTENTION_H_

#include "absl/status/status.h"
#include "core/attention_kernel.h"

namespace attention {

// True when this CPU has AVX-512 (F, BW, VL, DQ), checked once, and the
// environment does not set ATTENTION_FUSED_ATTENTION=0.
bool FusedAttentionAvailable();

// Bytes of the fused kernel's packed K^T for `planes` (items x heads) of
// `depth` features over `main_keys` keys and `total_keys` with the appended
// ones: panels of avx512::kPanel keys, zero-padded (float32; bfloat16 takes
// half).
int64_t FusedKeyPanelBytes(int64_t planes, int64_t depth, int64_t main_keys, int64_t total_keys);

// Whether the fused kernel's padding is worth it: its K^T panels take at
// most twice a K^T padded to 16 keys, or 8 MiB in all. Many items over a
// few keys each (8000 queries over 1 key: 524 MB of panels for 2 MB of
// keys) go to the primitive path instead. RunAttention and the engine's
// working-memory estimate both ask it.
bool FusedAttentionFits(int64_t planes, int64_t depth, int64_t main_keys, int64_t total_keys);

// "fused-avx512" or "onednn-primitives": the path RunAttention takes for a
// call without weights, for logs and benchmarks.
const char* AttentionPathName();

// Computes softmax(scale * Q K^T + mask) V into p.out. Requires
// FusedAttentionAvailable() and p.weights == nullptr (FAILED_PRECONDITION
// otherwise).
absl::Status RunFusedAttention(const AttentionProblem& p);

}  // namespace attention

#endif  // ATTENTION_CORE_FUSED_ATTENTION_H_
