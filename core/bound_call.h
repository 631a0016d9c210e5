// File: core/bound_call.h
//
// Per-thread reuse of what a cached oneDNN primitive's call needs besides
// the primitive: its dnnl::memory argument objects and the argument list
// oneDNN's C API takes. Made anew, they cost a primitive-cache key (several
// formatted descriptors), a locked lookup, allocations per memory object and
// a hash map per call: about 5% of a 1x32x256 call on one thread in perf
// (the projections' own work is 80%); reusing them took 3% off that call on
// one thread and 6% on two. A BoundCall is found by a small key of plain integers that fully
// determines the primitive and its memory descriptors (the caller's duty),
// and only the data pointers change from call to call.
//
// Thread-safety: each thread has its own few entries (thread_local), used
// only by that thread. An entry keeps its primitive by weak_ptr: a
// primitive evicted from (or destroyed with) its PrimitiveCache is not kept
// alive, and Find() then misses. While a call runs the entry holds the
// primitive.
//
// Example:
//   BoundCall* call = BoundCall::Find(key);
//   if (call == nullptr) call = BoundCall::Insert(key, prim, {{DNNL_ARG_SRC, src_md}, ...});
//   call->Set(DNNL_ARG_SRC, x);
//   RETURN_IF_ERROR(call->Execute());
#ifndef ATTENTION_CORE_BOUND_CALL_H_
#define ATTENTION_CORE_BOUND_CALL_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/primitive_cache.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace attention {

// Integers that determine a call's primitive and memory descriptors.
using BoundCallKey = std::array<int64_t, 12>;

class BoundCall {
 public:
  // Entries each thread keeps (least recently used replaced first).
  static constexpr int kEntries = 8;

  // The calling thread's entry for `key` whose primitive is still alive, or
  // nullptr. A non-null result holds its primitive until Execute().
  static BoundCall* Find(const BoundCallKey& key);

  // Makes the calling thread's entry for `key`: memory objects for `args`
  // (argument id, descriptor; data set later by Set()) and, if `prim` needs
  // one, a scratchpad. Replaces the least recently used entry; a pointer
  // from an earlier Find() or Insert() may no longer be valid. Holds `prim`
  // until Execute().
  static BoundCall* Insert(const BoundCallKey& key, std::shared_ptr<const CachedPrimitive> prim,
                           std::initializer_list<std::pair<int, dnnl::memory::desc>> args);

  // Points argument `arg` (one given to Insert) at `data`. Any other `arg`
  // makes the next Execute() fail (Internal) without running.
  void Set(int arg, const void* data);

  // Runs the primitive on the calling thread with the arguments set and a
  // scratchpad from the thread's workspace; then releases the primitive.
  // Internal (with oneDNN's message) if execution fails.
  absl::Status Execute();

  // Entries the calling thread holds whose primitive is alive (for tests).
  static int LiveEntries();

 private:
  BoundCallKey key_{};
  uint64_t last_use_ = 0;
  std::weak_ptr<const CachedPrimitive> prim_;
  std::shared_ptr<const CachedPrimitive> held_;  // During a call only.
  std::vector<dnnl::memory> memories_;           // One per argument,
  std::vector<dnnl_exec_arg_t> c_args_;          // passed to oneDNN's C API as these.
  dnnl::memory scratchpad_;                      // Empty when the primitive needs none.
  bool unbound_set_ = false;                     // Set() named an argument not bound.
};

}  // namespace attention

#endif  // ATTENTION_CORE_BOUND_CALL_H_
