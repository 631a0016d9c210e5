// File: server/batching/warmup.h
//
// WarmUp: one forward pass per common length (and a batch of two) so that
// a model version's oneDNN primitives exist before its first request.
// Thread-compatible: call it before the engine serves.
#ifndef ATTENTION_SERVER_BATCHING_WARMUP_H_
#define ATTENTION_SERVER_BATCHING_WARMUP_H_

#include <functional>

#include "absl/status/status.h"
#include "core/mha_engine.h"

namespace attention::server {

// The engine's error when a pass fails; Cancelled once `abandoned` (may be
// null, asked before each pass) says true.
absl::Status WarmUp(const MhaEngine& engine, const std::function<bool()>& abandoned = nullptr);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_BATCHING_WARMUP_H_
