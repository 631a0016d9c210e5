// File: server/sessions/session_batch_runner.h
//
// Runs a batch of session work (appends of different sessions, or one cross
// session's creation) on the batcher thread: per append it checks that the
// session is still live and within max_session_tokens, that its response
// (sized against the session's length now, not when the append was read)
// fits max_message_bytes and the in-flight budget, allocates its result
// buffers, and reserves its cache blocks (SessionManager::Reserve, which may
// evict idle sessions); then the
// model's SessionEngine computes every admitted append together, and each
// request's rows are converted straight into its response bytes. An append
// is applied if and only if its response is OK: one that fails (here, in the
// engine, or for memory) leaves its session unchanged, and nothing after the
// engine run allocates, so no session of a batch is left half-committed.
//
// Thread-compatible: called by one model's batcher thread, with every
// session in the batch busy (so no other thread touches their caches).
#ifndef ATTENTION_SERVER_SESSIONS_SESSION_BATCH_RUNNER_H_
#define ATTENTION_SERVER_SESSIONS_SESSION_BATCH_RUNNER_H_

#include <memory>
#include <vector>

#include "server/batching/batch_runner.h"
#include "server/batching/pending_request.h"
#include "server/sessions/append_size.h"
#include "server/sessions/session_manager.h"

namespace attention::server {

// Makes every serving version's batcher run its session work with RunSessionBatch on
// `manager`; once, right after the manager is made, before any session
// work is queued. `manager` must outlive the batchers' use of it.
void InstallSessionRunners(SessionManager& manager, const ModelRepository& repository);
// The same for one version (loaded after start), before it serves.
void InstallSessionRunner(SessionManager& manager, const ServedModel& served);

std::vector<RequestOutcome> RunSessionBatch(
    SessionManager& manager, SessionModel& model,
    const std::vector<std::unique_ptr<PendingRequest>>& batch, BatchStats* stats);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SESSIONS_SESSION_BATCH_RUNNER_H_
