// File: core/primitive_cache.h
//
// oneDNN glue for the engine: the process-wide CPU engine, a bounded LRU
// cache of primitives keyed by their full description, and a helper that
// executes a cached primitive with a scratchpad of its own.
//
// oneDNN primitives are immutable after creation and safe to execute from
// several threads at once when each execution brings its own scratchpad
// (scratchpad_mode::user), which Execute() does. PrimitiveCache is
// thread-safe.
#ifndef ATTENTION_CORE_PRIMITIVE_CACHE_H_
#define ATTENTION_CORE_PRIMITIVE_CACHE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace attention {

// The CPU engine every primitive of this process uses.
const dnnl::engine& CpuEngine();

// The calling thread's stream on CpuEngine() (streams are cheap but not free,
// and not thread-safe: one per thread).
dnnl::stream& ThreadStream();

// Appends a compact description of `md` (dims, data type, strides) to `key`.
void AppendMdKey(const dnnl::memory::desc& md, std::string* key);

// A created primitive and what executing it needs.
struct CachedPrimitive {
  dnnl::primitive primitive;
  dnnl::memory::desc scratchpad;  // Zero-sized when none is needed.
  std::string impl;               // oneDNN's implementation name, e.g. "brg:avx512_core".
};

class PrimitiveCache {
 public:
  // Holds at most `capacity` primitives, evicting the least recently used.
  explicit PrimitiveCache(size_t capacity);

  PrimitiveCache(const PrimitiveCache&) = delete;
  PrimitiveCache& operator=(const PrimitiveCache&) = delete;

  // Returns the primitive cached under `key`, or creates it from the
  // primitive descriptor `make_pd()` returns (called without the lock held;
  // the descriptor must use scratchpad_mode::user). Internal when oneDNN
  // cannot create it (the dnnl::error text is kept). The calling thread's
  // OpenMP thread count is part of the key: oneDNN fixes a primitive's
  // parallelism when it creates it.
  template <typename PrimitiveT, typename PdT>
  absl::StatusOr<std::shared_ptr<const CachedPrimitive>> GetOrCreate(
      const std::string& key, const std::function<PdT()>& make_pd);

  size_t size() const;
  uint64_t hits() const;
  uint64_t misses() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const CachedPrimitive>>;
  static std::string ThreadKey(const std::string& key);
  std::shared_ptr<const CachedPrimitive> Lookup(const std::string& key);
  void Insert(const std::string& key, std::shared_ptr<const CachedPrimitive> value);

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // Most recent first.
  std::unordered_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  uint64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

// Runs `prim` on the calling thread with `args` plus a freshly allocated
// scratchpad. Internal (with oneDNN's message) if execution fails.
absl::Status Execute(const CachedPrimitive& prim, std::unordered_map<int, dnnl::memory> args);

// A memory object over caller-owned `data` (no copy).
inline dnnl::memory Wrap(const dnnl::memory::desc& md, const void* data) {
  return dnnl::memory(md, CpuEngine(), const_cast<void*>(data));
}

template <typename PrimitiveT, typename PdT>
absl::StatusOr<std::shared_ptr<const CachedPrimitive>> PrimitiveCache::GetOrCreate(
    const std::string& key, const std::function<PdT()>& make_pd) {
  const std::string full_key = ThreadKey(key);
  if (auto hit = Lookup(full_key)) return hit;
  try {
    PdT pd = make_pd();
    auto created = std::make_shared<CachedPrimitive>();
    created->primitive = PrimitiveT(pd);
    created->scratchpad = pd.scratchpad_desc();
    created->impl = pd.impl_info_str();
    Insert(full_key, created);
    return std::shared_ptr<const CachedPrimitive>(std::move(created));
  } catch (const dnnl::error& e) {
    return absl::InternalError(std::string("oneDNN could not create a primitive: ") + e.what());
  }
}

}  // namespace attention

#endif  // ATTENTION_CORE_PRIMITIVE_CACHE_H_
