// File: server/batching/outcome_flush.h
//
// OutcomeFlush: a receiver of outcomes that delivers them in groups. A
// PendingRequest may name one (PendingRequest::flush); after the batcher has
// called `done` of every request of a batch (or of the requests it dropped
// together), it calls Flush() once on each distinct receiver they name, so
// that a front-end can hand a whole batch's responses to its transport with
// one wake-up instead of one per request.
//
// Implementations must be thread-safe (Flush() runs on a batcher thread),
// must not block, and must outlive every request that names them.
#ifndef ATTENTION_SERVER_BATCHING_OUTCOME_FLUSH_H_
#define ATTENTION_SERVER_BATCHING_OUTCOME_FLUSH_H_

namespace attention::server {

class OutcomeFlush {
 public:
  virtual ~OutcomeFlush() = default;
  // The outcomes given to `done` since the last Flush() are complete.
  virtual void Flush() = 0;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_BATCHING_OUTCOME_FLUSH_H_
