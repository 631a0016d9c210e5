// File: server/memory_plan.h
//
// Every memory budget of the server, derived from one limit (the cgroup's,
// or --memory_limit_bytes) so that their sum plus the process's own memory
// stays under kTargetShare of it:
//
//   baseline                  the process itself: code, models, runtime
//                             (estimated, then measured once ready)
//   max_inflight_bytes        requests accepted and not yet answered, their
//                             responses and the working memory computing them
//   grpc_receive_quota_bytes  gRPC's buffers of messages being received
//                             (not counted anywhere: the parsed copy of a
//                             message the service has not yet admitted or
//                             refused, one per gRPC callback thread)
//   session_memory_bytes      every session's key/value cache
//   workspaces_kept           engine scratch buffers threads keep between calls
//   allocator_reserve         freed memory malloc may keep (AllocatorTrimmer)
//
//   max_batch_working   the working memory of the one batch computing (its
//                       float32 attention weights, padded inputs,
//                       projections, workspaces): half of max_inflight_bytes
//                       (at most 512 MiB) unless set, held beside it
//
// A flag given explicitly (max_inflight_bytes, grpc_receive_quota_bytes,
// session_memory_bytes) is taken as is; the other budgets get their shares
// of what the baseline leaves of the target, scaled down together when the
// explicit ones leave less, and gRPC's quota is at most twice the in-flight
// budget (at least two largest messages). If the explicit flags and the
// baseline alone exceed the limit, Make() refuses.
//
//   MemoryPlanInputs in;
//   in.limit_bytes = MemoryLimitBytes(&in.limit_source);
//   ...
//   ASSIGN_OR_RETURN(MemoryPlan plan, MemoryPlan::Make(in));
//   std::cerr << plan.Table();
//
// A value type: immutable after Make(), safe to share.
#ifndef ATTENTION_SERVER_MEMORY_PLAN_H_
#define ATTENTION_SERVER_MEMORY_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace attention::server {

struct MemoryPlanInputs {
  // The memory the process may use, and where that figure came from.
  int64_t limit_bytes = 0;
  std::string limit_source;
  // The process's own memory once serving (see MemoryPlan::EstimateBaseline).
  int64_t baseline_bytes = 0;
  std::string baseline_source;
  // --max_message_bytes: gRPC's quota must hold at least one message.
  int64_t max_message_bytes = 64 << 20;
  // Explicit flags; 0 derives the budget from the limit.
  int64_t max_inflight_bytes = 0;
  int64_t grpc_receive_quota_bytes = 0;
  int64_t session_memory_bytes = 0;
  int64_t max_batch_working_bytes = 0;
};

class MemoryPlan {
 public:
  // The share of the limit the plan fills; the rest is a margin for what no
  // budget counts (thread stacks, gRPC's small allocations, page tables).
  static constexpr double kTargetShare = 0.85;
  // Shares of what the baseline leaves of the target, for derived budgets.
  // gRPC's quota is large: a flood of 64 concurrent 16 MiB requests keeps
  // about 300 MiB of partly received messages, and past its quota gRPC
  // cancels random calls ("Buffers full"), admitted ones too.
  static constexpr double kInflightShare = 0.17;  // And half that for the computing batch.
  static constexpr double kReceiveQuotaShare = 0.40;
  static constexpr double kSessionShare = 0.15;
  static constexpr double kWorkspaceShare = 0.15;
  static constexpr double kAllocatorShare = 0.10;

  // One row of the table.
  struct Line {
    std::string name;    // The budget (a flag's name where there is one).
    int64_t bytes = 0;   // Its size.
    std::string source;  // Where it came from.
    bool summed = true;  // False: inside another line, not added again.
  };

  // The plan for `in`. INVALID_ARGUMENT when limit_bytes is not positive or
  // an explicit flag is negative; FAILED_PRECONDITION when the explicit
  // flags and the baseline alone exceed the limit (the message names each
  // flag with its value, the baseline and the limit).
  static absl::StatusOr<MemoryPlan> Make(const MemoryPlanInputs& in);

  // The process's own memory once serving, estimated before models load:
  // `rss_now` (the resident set at the call), plus the resident bytes of
  // the models under `model_repository` (the demo model's when empty), each
  // the engine's estimate from config.json and the safetensors header
  // (server/batching/model_bytes.h: the packed weights, 1.0x the file for a
  // float32 model, 0.5x bfloat16, 0.25x int8; a model whose spec cannot be
  // read counts its file bytes), plus the largest model file once (a load's
  // transient: the tensors as read while the engine packs them), plus
  // kRuntimeBytes for what start-up adds (oneDNN's primitives and JIT code
  // from warm-up, gRPC, the metrics exposer). *source says how it was made
  // up.
  static int64_t EstimateBaseline(int64_t rss_now, const std::string& model_repository,
                                  std::string* source);
  // Measured: about 15 MiB from flag parsing to "ready" besides the model.
  static constexpr int64_t kRuntimeBytes = int64_t{32} << 20;

  int64_t limit_bytes() const { return limit_bytes_; }
  int64_t baseline_bytes() const { return baseline_bytes_; }
  int64_t max_inflight_bytes() const { return max_inflight_bytes_; }
  int64_t grpc_receive_quota_bytes() const { return grpc_receive_quota_bytes_; }
  int64_t session_memory_bytes() const { return session_memory_bytes_; }
  int64_t workspace_kept_bytes() const { return workspace_kept_bytes_; }
  int64_t allocator_reserve_bytes() const { return allocator_reserve_bytes_; }
  // The computing batch's working-memory (and weights) cap, beside max_inflight_bytes.
  int64_t max_batch_weights_bytes() const { return max_batch_weights_bytes_; }
  // The summed lines: baseline and every budget.
  int64_t total_bytes() const;
  // Problems that do not stop the server (over the target share, a budget
  // below what one largest message needs), one sentence each.
  const std::vector<std::string>& warnings() const { return warnings_; }

  const std::vector<Line>& lines() const { return lines_; }
  // The table logged at start: one line per budget, bytes and source, then
  // the total against the limit, then any warnings.
  std::string Table() const;

 private:
  MemoryPlan() = default;

  int64_t limit_bytes_ = 0;
  std::string limit_source_;
  int64_t baseline_bytes_ = 0;
  int64_t max_inflight_bytes_ = 0;
  int64_t grpc_receive_quota_bytes_ = 0;
  int64_t session_memory_bytes_ = 0;
  int64_t workspace_kept_bytes_ = 0;
  int64_t allocator_reserve_bytes_ = 0;
  int64_t max_batch_weights_bytes_ = 0;
  std::vector<Line> lines_;
  std::vector<std::string> warnings_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_MEMORY_PLAN_H_
