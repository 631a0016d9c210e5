#include "server/memory_plan.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/batching/dynamic_batcher.h"
#include "server/batching/model_bytes.h"

namespace attention::server {
namespace {

std::string MiB(int64_t bytes) { return absl::StrFormat("%.0f MiB", bytes / 1048576.0); }

std::string Percent(double share) { return absl::StrFormat("%.0f%%", share * 100); }

// What the model folders under `repository` (one level deep) take once
// loaded: each one's resident estimate (model_bytes.h), plus the largest
// file once for a load's transient (its tensors as read, while the engine
// packs them; loads run one at a time).
struct Models {
  int64_t resident = 0;
  int64_t largest_file = 0;
};
Models RepositoryModels(const std::string& repository) {
  Models m;
  std::error_code ec;
  for (const auto& model : std::filesystem::directory_iterator(repository, ec)) {
    if (!model.is_directory(ec)) continue;
    const int64_t file = ModelFileBytes(model.path().string());
    if (file == 0) continue;
    m.resident += EstimateModelBytes(model.path().string());
    m.largest_file = std::max(m.largest_file, file);
  }
  return m;
}

}  // namespace

int64_t MemoryPlan::EstimateBaseline(int64_t rss_now, const std::string& model_repository,
                                     std::string* source) {
  Models models;
  if (model_repository.empty()) {
    models.resident = EstimateModelBytes("");  // The demo model, made in memory.
  } else {
    models = RepositoryModels(model_repository);
  }
  if (source != nullptr) {
    *source = absl::StrCat("resident ", MiB(rss_now), " at start + ", MiB(models.resident),
                           " of models' weights + ", MiB(models.largest_file), " for a load + ",
                           MiB(kRuntimeBytes), " for the runtime");
  }
  return rss_now + models.resident + models.largest_file + kRuntimeBytes;
}

absl::StatusOr<MemoryPlan> MemoryPlan::Make(const MemoryPlanInputs& in) {
  if (in.limit_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory plan: the memory limit must be positive, got ", in.limit_bytes,
                     " bytes (", in.limit_source, ")"));
  }
  // The budgets a flag may set, with their shares when it does not.
  struct Budget {
    const char* name;
    int64_t flag;
    double share;
    int64_t* out;
  };
  MemoryPlan plan;
  const Budget budgets[] = {
      {"max_inflight_bytes", in.max_inflight_bytes, kInflightShare, &plan.max_inflight_bytes_},
      {"grpc_receive_quota_bytes", in.grpc_receive_quota_bytes, kReceiveQuotaShare,
       &plan.grpc_receive_quota_bytes_},
      {"session_memory_bytes", in.session_memory_bytes, kSessionShare, &plan.session_memory_bytes_},
      {"workspaces_kept", 0, kWorkspaceShare, &plan.workspace_kept_bytes_},
      {"allocator_reserve", 0, kAllocatorShare, &plan.allocator_reserve_bytes_},
  };
  // The explicit flags and the baseline alone must fit the limit.
  std::vector<std::string> named;
  int64_t fixed = 0;
  double derived_share = 0;
  for (const Budget& b : budgets) {
    if (b.flag < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "memory plan: --", b.name, " must be >= 0 (0: from the plan), got ", b.flag));
    }
    if (b.flag > 0) {
      named.push_back(absl::StrCat("--", b.name, "=", b.flag));
      fixed += b.flag;
    } else {
      derived_share += b.share;
    }
  }
  // The computing batch's working memory is held beside the in-flight
  // budget: half of it (at most kMaxBatchWeightsBytes) unless set.
  if (in.max_batch_working_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory plan: --max_batch_working_bytes must be >= 0 (0: from the plan), got ",
                     in.max_batch_working_bytes));
  }
  auto batch_of = [&](int64_t inflight) {
    return in.max_batch_working_bytes > 0
               ? in.max_batch_working_bytes
               : std::min(DynamicBatcher::kMaxBatchWeightsBytes, inflight / 2);
  };
  if (in.max_batch_working_bytes > 0) {
    named.push_back(absl::StrCat("--max_batch_working_bytes=", in.max_batch_working_bytes));
    fixed += in.max_batch_working_bytes;
  } else if (in.max_inflight_bytes > 0) {
    named.push_back(absl::StrCat("its batch's ", batch_of(in.max_inflight_bytes)));
    fixed += batch_of(in.max_inflight_bytes);
  }
  if (in.baseline_bytes < 0 || in.baseline_bytes > in.limit_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "memory plan: the process's baseline alone, ", in.baseline_bytes, " bytes (",
        in.baseline_source, "), is over the memory limit of ", in.limit_bytes, " bytes (",
        in.limit_source, "); serve fewer or smaller models or raise the limit"));
  }
  if (in.baseline_bytes + fixed > in.limit_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("memory plan: ", absl::StrJoin(named, " + "), " + the process's baseline ",
                     in.baseline_bytes, " (", in.baseline_source, ") = ", in.baseline_bytes + fixed,
                     " bytes, over the memory limit of ", in.limit_bytes, " bytes (",
                     in.limit_source, "); lower those flags or raise the limit"));
  }

  plan.limit_bytes_ = in.limit_bytes;
  plan.limit_source_ = in.limit_source;
  plan.baseline_bytes_ = in.baseline_bytes;
  const int64_t target = static_cast<int64_t>(kTargetShare * static_cast<double>(in.limit_bytes));
  const int64_t room = std::max<int64_t>(0, target - in.baseline_bytes);
  // Derived budgets: their shares of the room, scaled down together if the
  // explicit ones leave less.
  const int64_t left = std::max<int64_t>(0, room - fixed);
  const double wanted = derived_share * static_cast<double>(room);
  // (A byte of rounding is no reason to say so.)
  const double scale = wanted > static_cast<double>(left) + 1 ? left / wanted : 1.0;
  std::string scaled;
  if (scale < 1.0) {
    scaled = absl::StrCat(", scaled to ", Percent(scale), " to fit beside ",
                          absl::StrJoin(named, " and "));
  }
  plan.lines_.push_back({"baseline", in.baseline_bytes, in.baseline_source});
  for (const Budget& b : budgets) {
    if (b.flag > 0) {
      *b.out = b.flag;
      plan.lines_.push_back({b.name, b.flag, absl::StrCat("--", b.name)});
      continue;
    }
    *b.out = static_cast<int64_t>(b.share * scale * static_cast<double>(room));
    std::string source =
        absl::StrCat(Percent(b.share), " of the ", MiB(room), " the baseline leaves of ",
                     Percent(kTargetShare), " of the limit", scaled);
    if (b.out == &plan.grpc_receive_quota_bytes_) {
      // No more than twice what the service admits (at least two largest
      // messages), as before the plan: a smaller --max_inflight_bytes
      // shrinks it too.
      const int64_t cap = 2 * std::max(plan.max_inflight_bytes_, in.max_message_bytes);
      if (*b.out > cap) {
        *b.out = cap;
        source = "twice max(max_inflight_bytes, --max_message_bytes), under its share";
      }
      // gRPC must be able to receive one largest message.
      if (*b.out < in.max_message_bytes) {
        *b.out = in.max_message_bytes;
        source = "--max_message_bytes (one largest message; its share was smaller)";
      }
    }
    plan.lines_.push_back({b.name, *b.out, source});
  }
  plan.max_batch_weights_bytes_ = batch_of(plan.max_inflight_bytes_);
  plan.lines_.push_back(
      {"max_batch_working_bytes", plan.max_batch_weights_bytes_,
       in.max_batch_working_bytes > 0
           ? std::string("--max_batch_working_bytes")
           : absl::StrCat("half of max_inflight_bytes, at most ",
                          MiB(DynamicBatcher::kMaxBatchWeightsBytes),
                          ": the computing batch's working memory (weights included), beside it")});

  if (plan.total_bytes() > target) {
    plan.warnings_.push_back(absl::StrCat("the plan's ", plan.total_bytes(), " bytes exceed ",
                                          Percent(kTargetShare), " of the limit (", target,
                                          " bytes): little margin is left for what no budget "
                                          "counts"));
  }
  if (plan.max_inflight_bytes_ < 2 * in.max_message_bytes) {
    plan.warnings_.push_back(
        absl::StrCat("max_inflight_bytes ", plan.max_inflight_bytes_,
                     " is under twice --max_message_bytes (", in.max_message_bytes,
                     "): a largest request with its response will be refused RESOURCE_EXHAUSTED"));
  }
  return plan;
}

int64_t MemoryPlan::total_bytes() const {
  int64_t total = 0;
  for (const Line& line : lines_) {
    if (line.summed) total += line.bytes;
  }
  return total;
}

std::string MemoryPlan::Table() const {
  std::string out =
      absl::StrCat("memory plan: limit ", limit_bytes_, " bytes (", MiB(limit_bytes_), ", ",
                   limit_source_, "), budgets sized to ", Percent(kTargetShare), " of it:\n");
  for (const Line& line : lines_) {
    absl::StrAppendFormat(&out, "  %-26s %12d bytes %9s  %s%s\n",
                          line.summed ? line.name : absl::StrCat("(", line.name, ")"), line.bytes,
                          absl::StrCat("(", MiB(line.bytes), ")"), line.source,
                          line.summed ? "" : "; not added to the total");
  }
  absl::StrAppendFormat(&out, "  %-26s %12d bytes %9s  %s of the limit %d bytes\n", "total",
                        total_bytes(), absl::StrCat("(", MiB(total_bytes()), ")"),
                        Percent(static_cast<double>(total_bytes()) / limit_bytes_), limit_bytes_);
  for (const std::string& warning : warnings_) absl::StrAppend(&out, "  warning: ", warning, "\n");
  return out;
}

}  // namespace attention::server
