#include "core/primitive_cache.h"

#include <omp.h>
#include "absl/strings/str_cat.h"

#include "core/tensor.h"
#include "core/workspace.h"

namespace attention {

const dnnl::engine& CpuEngine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

dnnl::stream& ThreadStream() {
  thread_local dnnl::stream stream(CpuEngine());
  return stream;
}

void AppendMdKey(const dnnl::memory::desc& md, std::string* key) {
  const dnnl_memory_desc_t& d = md.data;
  absl::StrAppend(key, "{", static_cast<int>(d.data_type), ":");
  for (int i = 0; i < d.ndims; ++i) absl::StrAppend(key, d.dims[i], ",");
  absl::StrAppend(key, "/");
  for (int i = 0; i < d.ndims; ++i) absl::StrAppend(key, d.format_desc.blocking.strides[i], ",");
  absl::StrAppend(key, "}");
}

std::string PrimitiveCache::ThreadKey(const std::string& key) {
  return absl::StrCat(key, "@t", omp_get_max_threads());
}

PrimitiveCache::PrimitiveCache(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

std::shared_ptr<const CachedPrimitive> PrimitiveCache::Lookup(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void PrimitiveCache::Insert(const std::string& key, std::shared_ptr<const CachedPrimitive> value) {
  absl::MutexLock lock(&mu_);
  if (index_.count(key) > 0) return;  // Another thread created it first.
  lru_.emplace_front(key, std::move(value));
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

size_t PrimitiveCache::size() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

uint64_t PrimitiveCache::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

uint64_t PrimitiveCache::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

absl::Status Execute(const CachedPrimitive& prim, std::unordered_map<int, dnnl::memory> args) {
  try {
    std::unique_ptr<Workspace> scratchpad;  // Reused by this thread's next calls.
    if (prim.scratchpad.get_size() > 0) {
      scratchpad = std::make_unique<Workspace>(Workspace::kScratchpad, prim.scratchpad.get_size());
      args.emplace(DNNL_ARG_SCRATCHPAD, Wrap(prim.scratchpad, scratchpad->data()));
    }
    dnnl::stream& stream = ThreadStream();
    prim.primitive.execute(stream, args);
    stream.wait();
    return absl::OkStatus();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN execution failed: ", e.what()));
  }
}

}  // namespace attention
