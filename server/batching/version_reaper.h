// File: server/batching/version_reaper.h
//
// VersionReaper: frees retired model versions on a thread of its own. A
// version (ServedModel) is held by shared_ptrs: the repository's while it
// serves, and one per request admitted to it. The last holder may be the
// version's own batcher thread (a request's lease going with its finished
// PendingRequest), which cannot destroy the batcher that runs it; so the
// shared_ptr's deleter hands the version here, and this thread destroys it
// (its batcher computes whatever is still queued, then joins), returns the
// freed pages to the system (malloc_trim), then calls
// `freed` with the version's address (a key only by then) and its bytes.
//
// Thread-safe. Owns its thread; Stop() (or the destructor) waits for the
// versions already handed over, then frees later ones inline.
#ifndef ATTENTION_SERVER_BATCHING_VERSION_REAPER_H_
#define ATTENTION_SERVER_BATCHING_VERSION_REAPER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attention::server {

class VersionReaper {
 public:
  // `freed(key, bytes)` runs after each version is destroyed.
  explicit VersionReaper(std::function<void(const void*, int64_t)> freed);
  ~VersionReaper();

  VersionReaper(const VersionReaper&) = delete;
  VersionReaper& operator=(const VersionReaper&) = delete;

  // Runs `destroy` (which frees the version at `key`, of `bytes`) on the
  // reaper's thread, then `freed(key, bytes)`.
  void Retire(const void* key, int64_t bytes, std::function<void()> destroy);
  // Versions handed over or being destroyed.
  int64_t pending() const;
  // Waits until every version made with Own() is destroyed, or `timeout`.
  bool WaitAllFreed(absl::Duration timeout);
  // Counts a version now owned by a shared_ptr whose deleter calls Retire.
  void Own();
  // Joins the thread; later Retire() calls destroy inline, without `freed`.
  void Stop();

 private:
  void Run();
  struct Item {
    const void* key;
    int64_t bytes;
    std::function<void()> destroy;
  };
  void Destroy(Item item);

  std::function<void(const void*, int64_t)> freed_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  int64_t owned_ ABSL_GUARDED_BY(mu_) = 0;  // Versions alive (Own() minus destroyed).
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_BATCHING_VERSION_REAPER_H_
