// File: server/frontends/rest/http_connections.h
//
// HttpConnections: the open connections of one HttpServer, for its limit on
// open connections and its drain. Each connection registers itself while
// open (TryAdd fails past the limit) and removes itself when it goes; the
// drain asks every one to close after its answer, then closes them all
// whatever they do. Also counts exchanges not yet answered, which the drain
// waits for.
//
// Thread-safe. Shared (shared_ptr) by the server and its connections, so it
// outlives whichever goes last.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_HTTP_CONNECTIONS_H_
#define ATTENTION_SERVER_FRONTENDS_REST_HTTP_CONNECTIONS_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace attention::server {

// A connection as the registry closes it. Both calls are thread-safe.
class HttpConnectionControl {
 public:
  virtual ~HttpConnectionControl() = default;
  // `now`: close the socket whatever it is doing (cancelling a request
  // being computed); else once the current answer is written.
  virtual void Close(bool now) = 0;
};

class HttpConnections {
 public:
  explicit HttpConnections(int limit) : limit_(limit) {}

  // An id for a new connection, or 0 when `limit` are open (or closing).
  uint64_t TryAdd();
  // Makes the connection `id` reachable by CloseAll.
  void Attach(uint64_t id, std::weak_ptr<HttpConnectionControl> connection);
  void Remove(uint64_t id);
  // Closes every open connection (see HttpConnectionControl::Close); those
  // opened later are closed as they attach.
  void CloseAll(bool now);
  int open() const;
  std::atomic<int64_t>* outstanding() { return &outstanding_; }

 private:
  const int limit_;
  std::atomic<int64_t> outstanding_{0};
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  int closing_ ABSL_GUARDED_BY(mu_) = -1;  // -1: open; 0: after answers; 1: now.
  absl::flat_hash_map<uint64_t, std::weak_ptr<HttpConnectionControl>> connections_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_HTTP_CONNECTIONS_H_
