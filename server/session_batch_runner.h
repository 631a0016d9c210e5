// File: server/session_batch_runner.h
//
// Runs a batch of session work (appends of different sessions, or one cross
// session's creation) on the batcher thread: per append it checks that the
// session is still live and within max_session_tokens and reserves its cache
// blocks (SessionManager::Reserve, which may evict idle sessions); then the
// model's SessionEngine computes every admitted append together, and each
// request's rows are converted straight into its response bytes. An append
// that fails (here or in the engine) leaves its session unchanged.
//
// Thread-compatible: called by one model's batcher thread, with every
// session in the batch busy (so no other thread touches their caches).
#ifndef ATTENTION_SERVER_SESSION_BATCH_RUNNER_H_
#define ATTENTION_SERVER_SESSION_BATCH_RUNNER_H_

#include <memory>
#include <vector>

#include "server/batch_runner.h"
#include "server/pending_request.h"
#include "server/session_manager.h"

namespace attention::server {

std::vector<RequestOutcome> RunSessionBatch(
    SessionManager& manager, SessionModel& model,
    const std::vector<std::unique_ptr<PendingRequest>>& batch, BatchStats* stats);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SESSION_BATCH_RUNNER_H_
