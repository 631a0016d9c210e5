// File: server/requests/call_leases.h
//
// CallLeases: the model versions a call has looked up, held so that a
// version cannot be freed between the lookup and the request's own lease
// (PendingRequest::version_lease), nor while a listing describes it, nor
// while the call's answer is counted against it. Each version looked up is
// held once, until the leases go: with the call's CallContext for a unary
// call, with the request's own context for a request of a stream (a stream
// makes one per request it reads, so an idle stream holds no version).
// Also remembers the model name the call asked for, for its log line when
// no version was found.
//
// Thread-safe.
#ifndef ATTENTION_SERVER_REQUESTS_CALL_LEASES_H_
#define ATTENTION_SERVER_REQUESTS_CALL_LEASES_H_

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace attention::server {

class CallLeases {
 public:
  // Holds `lease` (a model version) until the leases go; holding one
  // already held changes nothing.
  void Hold(std::shared_ptr<const void> lease) {
    absl::MutexLock lock(&mu_);
    if (std::find(held_.begin(), held_.end(), lease) == held_.end()) {
      held_.push_back(std::move(lease));
    }
  }
  // Lets go of every version held (the call is answered: nothing reads
  // them any more), keeping the name asked for. Later Holds hold again.
  void Release() {
    std::vector<std::shared_ptr<const void>> released;  // Let go of outside the lock.
    absl::MutexLock lock(&mu_);
    released.swap(held_);
  }
  // Records `name` as the model the call asked for (the last one asked).
  void Asked(std::string name) {
    absl::MutexLock lock(&mu_);
    asked_ = std::move(name);
  }
  std::string asked() const {
    absl::MutexLock lock(&mu_);
    return asked_;
  }
  // Versions held (for tests).
  size_t held() const {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<const void>> held_ ABSL_GUARDED_BY(mu_);
  std::string asked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_REQUESTS_CALL_LEASES_H_
