// File: server/frontends/grpc/grpc_call.h
//
// CallOf(): the protocol-neutral CallContext of a gRPC call (callback or
// async), as every gRPC front-end hands it to the request path. Stateless.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_GRPC_CALL_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_GRPC_CALL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "server/requests/call_context.h"

namespace attention::server {

// The context of a call on `context`, for `method`, whose cancellation
// `is_cancelled` tells (optional: polled while the call's work is queued).
inline CallRef CallOf(const grpc::ServerContextBase& context, Method method,
                      std::function<bool()> is_cancelled) {
  auto call = std::make_shared<CallContext>();
  call->method = method;
  const auto& metadata = context.client_metadata();
  if (const auto it = metadata.find("authorization"); it != metadata.end()) {
    call->authorization = std::string(it->second.data(), it->second.size());
  }
  call->peer = context.peer();
  const auto deadline = context.deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    call->deadline = absl::FromChrono(deadline);
  }
  call->is_cancelled = std::move(is_cancelled);
  return call;
}

// The context of a callback call `context` (which must outlive the returned
// context's is_cancelled use: the call's queued work), for `method`.
inline CallRef CallOf(grpc::CallbackServerContext* context, Method method) {
  if (context == nullptr) {  // Tests and fuzzers without a call.
    auto call = std::make_shared<CallContext>();
    call->method = method;
    return call;
  }
  return CallOf(*context, method, [context] { return context->IsCancelled(); });
}

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_GRPC_CALL_H_
