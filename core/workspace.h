// File: core/workspace.h
//
// Scratch memory for one engine call that the calling thread reuses on its
// next calls, so that a steady stream of calls allocates nothing and takes
// no page faults (freshly mapped pages cost a fault per 4 KiB on these
// machines; glibc returns large blocks to the OS on free).
//
// Each thread keeps one buffer per Slot (buffers used at the same time in
// one call need different slots), grown as needed. What every thread keeps
// together is one process-wide budget, KeptLimit() (the server sets it from
// its memory plan): a buffer is kept only while the total stays within it
// and the buffer itself is at most MaxKeptBufferBytes() (half the budget),
// so one large call cannot take the whole budget from the steady shapes; a
// long sequence's buffers of any size are reused as long as the budget
// (the bench's --workspace_kept_bytes, the server's workspaces_kept) allows. Any other request gets
// memory of its own, freed when the Workspace goes. A thread's kept buffers are freed (and leave
// the total) when the thread exits.
//
// Example:
//   Workspace context(Workspace::kContext, n * l * e * sizeof(float));
//   float* c = context.as<float>();
//
// A Workspace is not shareable across threads: it belongs to the thread that
// made it. The static functions are thread-safe. Allocation failure throws
// std::bad_alloc (see tensor.h).
#ifndef ATTENTION_CORE_WORKSPACE_H_
#define ATTENTION_CORE_WORKSPACE_H_

#include <cstddef>
#include <cstdint>

#include "core/memory_meter.h"
#include "core/tensor.h"

namespace attention {

class Workspace {
 public:
  enum Slot {
    kQueryInput,             // The query converted to the compute dtype.
    kKeyInput,               // The key, likewise.
    kValueInput,             // The value, likewise.
    kProjected,              // Projected Q (and K, V for fused self-attention).
    kKeysValues,             // Projected K and V with appended keys.
    kContext,                // Attention output before the out-projection.
    kScratchpad,             // oneDNN's per-call scratchpad.
    kKernelKeys,             // The fused kernel's K^T.
    kKernelValues,           // The fused kernel's widened V.
    kQuantizedInput,         // int8 projections: rows quantized, their scales;
    kQuantizedAccumulators,  // int8 projections: a block of int32 products.
    kScores,                 // The primitive path's block of scores.
    kScoreMask,              // Its block of additive masks.
    kProbabilities16,        // Its bfloat16 probabilities.
    // A caller's padded batch for ForwardBatch (the server's batcher thread):
    kBatchQuery,    // Its queries,
    kBatchKey,      // keys,
    kBatchValue,    // values,
    kBatchOutput,   // output
    kBatchWeights,  // and attention weights.
    // A batch of session steps (SessionEngine):
    kStepTokens,    // The appended tokens in float32,
    kStepQuery,     // their projected queries,
    kStepKey,       // keys,
    kStepValue,     // values,
    kStepContext,   // attention context,
    kStepOutput,    // out-projection
    kStepWeights,   // per-head weights to average
    kStepPartials,  // and the decode kernel's per-split partials.
    kSlotCount,
  };
  // The process-wide budget until SetKeptLimit() is called.
  static constexpr size_t kDefaultKeptLimit = size_t{256} << 20;

  // At least `bytes` bytes, 64-byte aligned, uninitialised.
  Workspace(Slot slot, size_t bytes);

  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

  // Bytes the calling thread keeps across calls (for tests and benchmarks).
  static size_t KeptBytes();
  // Bytes every thread keeps together; never above KeptLimit() (except
  // transiently after a lowering, until threads replace their buffers).
  static size_t TotalKeptBytes();
  // The process-wide budget of kept bytes. Lowering it frees nothing already
  // kept; it takes effect as buffers are replaced or threads exit.
  static void SetKeptLimit(size_t bytes);
  static size_t KeptLimit();
  // The largest buffer kept: KeptLimit() / 2.
  static size_t MaxKeptBufferBytes();

 private:
  AlignedBuffer own_;   // Only for requests not kept.
  MeterCharge charge_;  // The bytes asked for, on the MemoryMeter.
  void* data_ = nullptr;
};

}  // namespace attention

#endif  // ATTENTION_CORE_WORKSPACE_H_
