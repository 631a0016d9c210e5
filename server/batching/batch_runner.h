// File: server/batching/batch_runner.h
//
// Runs a batch of requests as one engine call: every item of every request is
// padded to the batch's longest query and key, each keeps its own masks,
// causal flag and valid lengths (padding is folded into its key mask), and
// the results are cut back to each request's own shape. A request's result
// does not depend on what it was batched with (up to float rounding, 1e-6).
#ifndef ATTENTION_SERVER_BATCHING_BATCH_RUNNER_H_
#define ATTENTION_SERVER_BATCHING_BATCH_RUNNER_H_

#include <memory>
#include <vector>

#include "core/mha_engine.h"
#include "server/batching/pending_request.h"

namespace attention::server {

struct BatchStats {
  int64_t real_tokens = 0;    // Sum of the requests' query tokens.
  int64_t padded_tokens = 0;  // Items x longest query.
  double flops = 0;           // Of the padded shapes.
};

// Computes `batch` (all self-attention, or all with key and value) on
// `engine`. Returns one outcome per request, in order; an engine failure is
// every request's status. Thread-compatible: one batch per call.
std::vector<RequestOutcome> RunBatch(const MhaEngine& engine,
                                     const std::vector<std::unique_ptr<PendingRequest>>& batch,
                                     BatchStats* stats);

// An upper bound on the bytes RunBatch allocates for a batch of `items`
// items padded to `queries` and `keys` rows: its padded float32 inputs,
// output and weights, and the engine's working memory. The responses' own
// bytes are not included (each request's admission counts them).
int64_t BatchWorkingBytes(const MhaEngine& engine, int64_t items, int64_t queries, int64_t keys,
                          bool self_attention, bool need_weights);

// FLOPs of a forward pass of `items` sequences of `queries` x `keys` (counted
// as the core benchmark does).
double ForwardFlops(const MhaSpec& spec, int64_t items, int64_t queries, int64_t keys);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_BATCHING_BATCH_RUNNER_H_
