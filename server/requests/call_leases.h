// File: server/requests/call_leases.h
//
// CallLeases: the model versions a call has looked up, held so that a
// version cannot be freed between the lookup and the request's own lease
// (PendingRequest::version_lease), nor while a listing describes it. One
// lease per model name: a stream's next lookup of the same model replaces
// the previous one (each queued request holds its own). Released with the
// call's CallContext.
//
// Thread-safe.
#ifndef ATTENTION_SERVER_REQUESTS_CALL_LEASES_H_
#define ATTENTION_SERVER_REQUESTS_CALL_LEASES_H_

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace attention::server {

class CallLeases {
 public:
  // Holds `lease` for `key` (a model name), letting go of the previous one.
  void Hold(const std::string& key, std::shared_ptr<const void> lease) {
    std::shared_ptr<const void> previous;  // Let go of outside the lock.
    absl::MutexLock lock(&mu_);
    previous = std::exchange(held_[key], std::move(lease));
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const void>> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_REQUESTS_CALL_LEASES_H_
