#include "core/bound_call.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/workspace.h"

namespace attention {
namespace {

struct ThreadEntries {
  std::array<BoundCall, BoundCall::kEntries> entries;
  uint64_t clock = 0;
};

ThreadEntries& Entries() {
  thread_local ThreadEntries entries;
  return entries;
}

}  // namespace

BoundCall* BoundCall::Find(const BoundCallKey& key) {
  ThreadEntries& t = Entries();
  for (BoundCall& e : t.entries) {
    if (e.last_use_ == 0 || e.key_ != key) continue;
    e.held_ = e.prim_.lock();
    if (e.held_ == nullptr) {  // Evicted from its cache: free the memory objects too.
      e = BoundCall();
      return nullptr;
    }
    e.last_use_ = ++t.clock;
    return &e;
  }
  return nullptr;
}

BoundCall* BoundCall::Insert(const BoundCallKey& key, std::shared_ptr<const CachedPrimitive> prim,
                             std::initializer_list<std::pair<int, dnnl::memory::desc>> args) {
  ThreadEntries& t = Entries();
  BoundCall* slot = &t.entries[0];
  for (BoundCall& e : t.entries) {
    if (e.last_use_ < slot->last_use_) slot = &e;
  }
  *slot = BoundCall();
  slot->key_ = key;
  slot->last_use_ = ++t.clock;
  for (const auto& [id, md] : args) {
    slot->memories_.emplace_back(md, CpuEngine(), nullptr);
    slot->c_args_.push_back({id, slot->memories_.back().get()});
  }
  if (prim->scratchpad.get_size() > 0) {
    slot->scratchpad_ = dnnl::memory(prim->scratchpad, CpuEngine(), nullptr);
    slot->c_args_.push_back({DNNL_ARG_SCRATCHPAD, slot->scratchpad_.get()});
  }
  slot->prim_ = prim;
  slot->held_ = std::move(prim);
  return slot;
}

void BoundCall::Set(int arg, const void* data) {
  for (size_t i = 0; i < memories_.size(); ++i) {
    if (c_args_[i].arg != arg) continue;
    if (memories_[i].get_data_handle() != data)
      memories_[i].set_data_handle(const_cast<void*>(data));
    return;
  }
  unbound_set_ = true;  // Execute() refuses to run.
}

absl::Status BoundCall::Execute() {
  std::shared_ptr<const CachedPrimitive> prim = std::move(held_);
  held_.reset();
  if (prim == nullptr) return absl::InternalError("BoundCall::Execute without Find or Insert");
  if (unbound_set_) {
    unbound_set_ = false;
    return absl::InternalError("BoundCall::Set named an argument Insert was not given");
  }
  try {
    std::optional<Workspace> scratchpad;  // Reused by this thread's next calls.
    if (scratchpad_) {
      scratchpad.emplace(Workspace::kScratchpad, prim->scratchpad.get_size());
      if (scratchpad_.get_data_handle() != scratchpad->data()) {
        scratchpad_.set_data_handle(scratchpad->data());
      }
    }
    dnnl::stream& stream = ThreadStream();
    dnnl::error::wrap_c_api(
        dnnl_primitive_execute(prim->primitive.get(), stream.get(),
                               static_cast<int>(c_args_.size()), c_args_.data()),
        "could not execute a primitive");
    stream.wait();
    return absl::OkStatus();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN execution failed: ", e.what()));
  }
}

int BoundCall::LiveEntries() {
  int live = 0;
  for (const BoundCall& e : Entries().entries) live += e.last_use_ != 0 && !e.prim_.expired();
  return live;
}

}  // namespace attention
