// File: server/frontends/grpc/admitted_reactor.h
//
// The reactor of a unary call whose request was admitted against the
// in-flight budget: it holds the request's Admission until gRPC is done with
// the call (the response sent, or dropped because the client went away), not
// only until the response was handed to gRPC, so that responses a client
// never reads stay inside the budget. Owns itself: deleted in OnDone().
//
// Thread-safe for its one use: Hold() before Finish(), from any thread.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_ADMITTED_REACTOR_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_ADMITTED_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <utility>

#include "server/requests/inflight_budget.h"

namespace attention::server {

class AdmittedUnaryReactor : public grpc::ServerUnaryReactor, public AdmissionHolder {
 public:
  // Keeps `held` until the call is done.
  void Hold(std::shared_ptr<Admission> held) override { held_ = std::move(held); }
  void OnDone() override { delete this; }
  // OnDone() only frees memory and the admission (atomic counters), and
  // OnCancel() is gRPC's empty default: gRPC may run them on the thread that
  // completed the call instead of handing them to its executor thread, a
  // wake-up per call saved. (gRPC marks this hook as internal, for reactors
  // whose reactions are trivial: these are.)
  bool InternalInlineable() override { return true; }

 private:
  std::shared_ptr<Admission> held_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_ADMITTED_REACTOR_H_
