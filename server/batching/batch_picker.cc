#include "server/batching/batch_picker.h"

#include <algorithm>
#include <cstdint>

#include "server/batching/batch_runner.h"
#include "server/batching/dynamic_batcher.h"

namespace attention::server {
namespace {

// Session work: steps are packed, not padded, so only their tokens add up;
// a cross session's creation goes alone.
std::vector<FairQueue::Position> PickSessionBatch(const FairQueue& queue,
                                                  const BatchingOptions& options, bool* ready) {
  std::vector<FairQueue::Position> picked;
  int64_t tokens = 0, working = 0;
  queue.Visit([&](const PendingRequest& r, FairQueue::Position p) {
    if (picked.empty()) {  // The head.
      picked.push_back(p);
      tokens = r.tokens();
      working = r.working_bytes;
      *ready = options.max_batch_size == 1 || r.session->kind == SessionWork::Kind::kInitCross;
      return !*ready;
    }
    if (static_cast<int64_t>(picked.size()) >= options.max_batch_size) return false;
    if (r.session == nullptr || r.session->kind != SessionWork::Kind::kAppend) return true;
    if (tokens + r.tokens() > options.max_batch_tokens) {
      *ready = true;
      return false;
    }
    // Steps' working memory adds up; a step that does not fit waits.
    if (working + r.working_bytes > options.max_working_bytes) return true;
    working += r.working_bytes;
    tokens += r.tokens();
    picked.push_back(p);
    return true;
  });
  if (static_cast<int64_t>(picked.size()) >= options.max_batch_size) *ready = true;
  return picked;
}

}  // namespace

std::vector<FairQueue::Position> PickBatch(const FairQueue& queue, const BatchingOptions& options,
                                           const MhaEngine& engine, bool* ready) {
  const PendingRequest& first = queue.Head();
  *ready = false;
  if (first.session != nullptr) return PickSessionBatch(queue, options, ready);
  const bool self_attention = first.call.self_attention;
  std::vector<FairQueue::Position> picked;
  int64_t items = first.call.batch, max_l = first.call.queries, real = first.tokens();
  int64_t max_s = first.call.keys, real_keys = first.key_tokens();
  bool weights = first.inputs.need_weights;
  const int64_t heads = engine.model().spec().num_heads;
  queue.Visit([&](const PendingRequest& r, FairQueue::Position p) {
    if (picked.empty()) {  // The head.
      picked.push_back(p);
      // A request that alone exceeds the key-token limit (long
      // cross-attention keys) goes by itself: padding others to its keys
      // could take any memory.
      *ready = options.max_batch_size == 1 || first.key_tokens() > options.max_batch_tokens;
      return !*ready;
    }
    if (static_cast<int64_t>(picked.size()) >= options.max_batch_size) return false;
    if (r.call.self_attention != self_attention || r.session != nullptr) return true;
    const int64_t l = std::max(max_l, r.call.queries);
    const int64_t padded = (items + r.call.batch) * l;
    if (padded > options.max_batch_tokens) {
      *ready = true;  // The batch cannot grow past the token limit.
      return false;
    }
    if (padded > options.max_padding_ratio * static_cast<double>(real + r.tokens())) {
      return true;  // Leave it for a batch of its own length.
    }
    // The same two rules for keys: every item is padded to the longest key.
    const int64_t s = std::max(max_s, r.call.keys);
    const int64_t padded_keys = (items + r.call.batch) * s;
    if (padded_keys > options.max_batch_tokens ||
        padded_keys > options.max_padding_ratio * static_cast<double>(real_keys + r.key_tokens())) {
      return true;
    }
    const bool with_weights = weights || r.inputs.need_weights;
    if ((with_weights && padded * heads * s * 4 > options.max_batch_weights_bytes) ||
        BatchWorkingBytes(engine, items + r.call.batch, l, s, self_attention, with_weights) >
            options.max_working_bytes) {
      return true;  // The batch's weights or working memory would grow too large.
    }
    max_s = s;
    weights |= r.inputs.need_weights;
    picked.push_back(p);
    items += r.call.batch;
    max_l = l;
    real += r.tokens();
    real_keys += r.key_tokens();
    return true;
  });
  if (static_cast<int64_t>(picked.size()) >= options.max_batch_size) *ready = true;
  return picked;
}

}  // namespace attention::server
