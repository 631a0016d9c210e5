// File: server/infer_stream_reactor.h
//
// The reactor of one attention.v1 InferStream call: many requests in flight
// on one stream. Each request read is prepared and queued on its own;
// completions (from batcher threads, in any order) queue their response for
// writing, one write at a time.
//
// Back-pressure: a request counts as pending from the moment it is read until
// its response is written (or dropped because the client went away). While
// the stream's pending requests reach ServiceOptions::max_stream_pending, or
// their bytes (request plus estimated response) max_stream_pending_bytes, the
// reactor stops reading; each completed write resumes reading once below both
// caps. A client that never reads its responses therefore holds a bounded
// amount of server memory and slows only itself.
//
// A request is reported answered to the service (metrics and drain) when its
// response has been written, not when it was computed, so a drain waits for
// stream responses to reach the client.
//
// The stream finishes once the client has half-closed, every request is
// answered and every response written. Owns itself: deleted in OnDone().
// Thread-safe: reactions and completions may run on any threads.
#ifndef ATTENTION_SERVER_INFER_STREAM_REACTOR_H_
#define ATTENTION_SERVER_INFER_STREAM_REACTOR_H_

#include <cstdint>
#include <deque>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attention/v1/attention.grpc.pb.h"
#include "server/attention_service.h"

namespace attention::server {

class InferStreamReactor : public grpc::ServerBidiReactor<v1::InferRequest, v1::InferResponse> {
 public:
  // `service` must outlive the reactor (the server waits for every call).
  InferStreamReactor(AttentionServiceImpl* service, grpc::CallbackServerContext* context);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  // A response waiting to be written, and what to report once it is.
  struct Outgoing {
    v1::InferResponse response;
    const ServedModel* model = nullptr;
    absl::StatusCode code = absl::StatusCode::kOk;
    absl::Time received;
    int64_t charge = 0;  // Bytes counted against max_stream_pending_bytes.
  };

  void StartNextRead();
  // Queues the response to a request charged `charge` bytes.
  void Respond(v1::InferResponse response, const ServedModel* model, absl::StatusCode code,
               absl::Time received, int64_t charge);
  // True when another request may be read now.
  bool MayReadLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True once (and only once) the stream is done: half-closed, every request
  // answered, every response written.
  bool ShouldFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  AttentionServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  std::unique_ptr<v1::InferRequest> incoming_;  // Only the reaction thread touches it.
  absl::Mutex mu_;
  std::deque<Outgoing> writes_ ABSL_GUARDED_BY(mu_);  // Front is being written.
  int64_t unanswered_ ABSL_GUARDED_BY(mu_) = 0;       // Read, not yet computed.
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;          // Read, response not yet written.
  int64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // A read is outstanding.
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_INFER_STREAM_REACTOR_H_
