// File: server/frontends/grpc/health_service.h
//
// grpc.health.v1.Health, served by the project instead of gRPC's built-in
// service so that health checks can be put behind authentication
// (--auth_probes) and so that the service's descriptors are linked into the
// server (reflection resolves them).
//
// Check answers SERVING / NOT_SERVING for "" (the whole server) and each
// registered service name, NOT_FOUND for other names. Watch sends the current
// status at once and then every change (SERVICE_UNKNOWN for other names, as
// the protocol says), until the client cancels or the server shuts down.
//
// Thread-safe. `authenticate` (may be empty: no authentication) must stay
// valid while the service serves.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_HEALTH_SERVICE_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_HEALTH_SERVICE_H_

#include <functional>
#include <map>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace attention::server {

class HealthServiceImpl final : public grpc::health::v1::Health::CallbackService {
 public:
  // Decides whether a call may check health (OK) or not (its error).
  using Authenticate = std::function<absl::Status(const grpc::CallbackServerContext*)>;

  // Every name in `services` (and "") starts NOT_SERVING.
  HealthServiceImpl(const std::set<std::string>& services, Authenticate authenticate);
  ~HealthServiceImpl() override;

  // Sets every service's status and tells the watchers.
  void SetServing(bool serving);

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  class Watcher;
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  ServingStatus StatusOfLocked(const std::string& service) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remove(Watcher* watcher);

  const Authenticate authenticate_;
  mutable absl::Mutex mu_;
  std::map<std::string, bool> serving_ ABSL_GUARDED_BY(mu_);
  std::set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_HEALTH_SERVICE_H_
