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
#include "server/sessions/session_manager.h"

namespace attention::server {

// Field tags and lengths, shapes, timings of a response: well under this.
inline constexpr int64_t kResponseFramingBytes = 1024;

// The size of an append's response, at most: output (T, E) and, when asked,
// weights over `columns` keys, in `out_dtype`, with framing and `id_bytes`.
int64_t AppendResponseBytes(const MhaSpec& spec, int64_t tokens, int64_t columns, DType out_dtype,
                            bool need_weights, bool average_weights, int64_t id_bytes);

// An upper bound on what computing an append allocates besides its
// response: the engine's working memory and this runner's float32 buffers.
int64_t AppendWorkingBytes(const SessionEngine& engine, int64_t tokens, int64_t columns,
                           DType out_dtype, bool need_weights, bool average_weights);

std::vector<RequestOutcome> RunSessionBatch(
    SessionManager& manager, SessionModel& model,
    const std::vector<std::unique_ptr<PendingRequest>>& batch, BatchStats* stats);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SESSIONS_SESSION_BATCH_RUNNER_H_
