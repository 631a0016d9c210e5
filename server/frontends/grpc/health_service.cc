#include "server/frontends/grpc/health_service.h"

#include "server/requests/identifiers.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/codec/status_codes.h"

namespace attention::server {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch call: writes the latest status whenever it differs from the last
// one written, one write at a time. Deleted in OnDone().
class HealthServiceImpl::Watcher final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  Watcher(HealthServiceImpl* service, std::string name)
      : service_(service), name_(std::move(name)) {}

  const std::string& name() const { return name_; }

  // The watched service's status is now `status`.
  void Notify(ServingStatus status) {
    absl::MutexLock lock(&mu_);
    latest_ = status;
    MaybeWriteLocked();
  }

  // Ends the call with `status` (after the write in flight, if any).
  void End(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    ending_ = true;
    end_status_ = std::move(status);
    MaybeWriteLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) ending_ = true;  // The client is gone.
    MaybeWriteLocked();
  }
  void OnCancel() override { End(grpc::Status::CANCELLED); }
  void OnDone() override {
    service_->Remove(this);
    delete this;
  }

 private:
  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (ending_) {
      finished_ = true;
      Finish(end_status_);
      return;
    }
    if (written_ == latest_) return;
    written_ = latest_;
    response_.set_status(latest_);
    writing_ = true;
    StartWrite(&response_);
  }

  HealthServiceImpl* const service_;
  const std::string name_;
  absl::Mutex mu_;
  HealthCheckResponse response_ ABSL_GUARDED_BY(mu_);
  ServingStatus latest_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  ServingStatus written_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
};

HealthServiceImpl::HealthServiceImpl(const std::set<std::string>& services,
                                     Authenticate authenticate)
    : authenticate_(std::move(authenticate)) {
  absl::MutexLock lock(&mu_);
  serving_[""] = false;
  for (const std::string& s : services) serving_[s] = false;
}

HealthServiceImpl::~HealthServiceImpl() {
  // The server has shut down (every call finished) before the service goes.
}

HealthServiceImpl::ServingStatus HealthServiceImpl::StatusOfLocked(
    const std::string& service) const {
  const auto it = serving_.find(service);
  if (it == serving_.end()) return HealthCheckResponse::SERVICE_UNKNOWN;
  return it->second ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

void HealthServiceImpl::SetServing(bool serving) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, value] : serving_) value = serving;
  for (Watcher* w : watchers_) w->Notify(StatusOfLocked(w->name()));
}

void HealthServiceImpl::Remove(Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(watcher);
}

grpc::ServerUnaryReactor* HealthServiceImpl::Check(grpc::CallbackServerContext* context,
                                                   const HealthCheckRequest* request,
                                                   HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (authenticate_) {
    const absl::Status allowed = authenticate_(context);
    if (!allowed.ok()) {
      reactor->Finish(wire::ToGrpcStatus(allowed));
      return reactor;
    }
  }
  ServingStatus status;
  {
    absl::MutexLock lock(&mu_);
    status = StatusOfLocked(request->service());
  }
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::NOT_FOUND,
                     absl::StrCat("service: '", Shown(request->service()), "' is unknown")));
    return reactor;
  }
  response->set_status(status);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthServiceImpl::Watch(
    grpc::CallbackServerContext* context, const HealthCheckRequest* request) {
  auto* watcher = new Watcher(this, request->service());
  if (authenticate_) {
    const absl::Status allowed = authenticate_(context);
    if (!allowed.ok()) {
      watcher->End(wire::ToGrpcStatus(allowed));
      return watcher;  // Not registered: OnDone's Remove finds nothing.
    }
  }
  absl::MutexLock lock(&mu_);
  watchers_.insert(watcher);
  watcher->Notify(StatusOfLocked(watcher->name()));
  return watcher;
}

}  // namespace attention::server
