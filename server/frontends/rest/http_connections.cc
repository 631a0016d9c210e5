// File: server/frontends/rest/http_connections.cc
#include "server/frontends/rest/http_connections.h"

#include <utility>
#include <vector>

namespace attention::server {

uint64_t HttpConnections::TryAdd() {
  absl::MutexLock lock(&mu_);
  if (open_ >= limit_) return 0;
  ++open_;
  return next_id_++;
}

void HttpConnections::Attach(uint64_t id, std::weak_ptr<HttpConnectionControl> connection) {
  int closing;
  {
    absl::MutexLock lock(&mu_);
    connections_[id] = connection;
    closing = closing_;
  }
  if (closing >= 0) {
    if (auto c = connection.lock()) c->Close(closing == 1);
  }
}

void HttpConnections::Remove(uint64_t id) {
  absl::MutexLock lock(&mu_);
  connections_.erase(id);
  --open_;
}

void HttpConnections::CloseAll(bool now) {
  std::vector<std::shared_ptr<HttpConnectionControl>> open;
  {
    absl::MutexLock lock(&mu_);
    closing_ = now ? 1 : 0;
    for (const auto& [id, weak] : connections_) {
      if (auto c = weak.lock()) open.push_back(std::move(c));
    }
  }
  for (const auto& c : open) c->Close(now);
}

int HttpConnections::open() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

}  // namespace attention::server
