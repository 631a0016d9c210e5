// File: server/requests/call_context.h
//
// CallContext: what the request path needs to know of a call, in no
// protocol's types. A front-end fills one per call (per stream for streams)
// from its transport (frontends/grpc/grpc_call.h for gRPC) and shares it with
// the work it queues.
//
// Immutable once made (but for its leases, which are thread-safe), so safe to share between
// threads; held by shared_ptr, it outlives the call's queued work.
#ifndef ATTENTION_SERVER_REQUESTS_CALL_CONTEXT_H_
#define ATTENTION_SERVER_REQUESTS_CALL_CONTEXT_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "server/metrics/metrics.h"
#include "server/requests/call_leases.h"

namespace attention::server {

struct CallContext {
  Method method = Method::kInfer;
  // The call's "authorization" metadata (a bearer token), if it had one.
  std::optional<std::string> authorization;
  // The transport's peer address, for logs.
  std::string peer;
  // Deadline and cancellation, which the batcher checks while work waits.
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> is_cancelled;  // Optional.
  // The model versions this call looked up (RequestPath pins them here).
  std::shared_ptr<CallLeases> leases = std::make_shared<CallLeases>();
};

using CallRef = std::shared_ptr<const CallContext>;

// The context of one request read on the stream `stream`: the stream's,
// with leases of its own, so that the versions the request looks up are
// held while it is in flight and let go once it is answered (an idle
// stream holds none).
inline std::shared_ptr<CallContext> RequestOf(const CallContext& stream) {
  auto call = std::make_shared<CallContext>(stream);
  call->leases = std::make_shared<CallLeases>();
  return call;
}

}  // namespace attention::server

#endif  // ATTENTION_SERVER_REQUESTS_CALL_CONTEXT_H_
