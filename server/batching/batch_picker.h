// File: server/batching/batch_picker.h
//
// Which queued requests go together in the next batch: the fair queue's head,
// then, in fair order, every request that can share its batch (the rules of
// DynamicBatcher's header: the same kind of work, padding at most
// max_padding_ratio on queries and keys, max_batch_tokens, the weights and
// working-memory caps, max_batch_size). A request that cannot join keeps its
// place for a later batch. Batches mix tenants: their results are
// independent.
//
// Pure functions of the queue and the options; the caller holds the queue's
// lock.
#ifndef ATTENTION_SERVER_BATCHING_BATCH_PICKER_H_
#define ATTENTION_SERVER_BATCHING_BATCH_PICKER_H_

#include <vector>

#include "core/mha_engine.h"
#include "server/batching/fair_queue.h"

namespace attention::server {

struct BatchingOptions;  // server/batching/dynamic_batcher.h

// The next batch, head first. *ready: it must go now (full, or nothing more
// can join it). The queue must not be empty.
std::vector<FairQueue::Position> PickBatch(const FairQueue& queue, const BatchingOptions& options,
                                           const MhaEngine& engine, bool* ready);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_BATCHING_BATCH_PICKER_H_
