#include "server/memory_plan.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/dynamic_batcher.h"

namespace attention::server {
namespace {

std::string MiB(int64_t bytes) { return absl::StrFormat("%.0f MiB", bytes / 1048576.0); }

std::string Percent(double share) { return absl::StrFormat("%.0f%%", share * 100); }

// Bytes of the model files (*.safetensors) under `repository`, one level of
// model folders deep.
int64_t ModelFileBytes(const std::string& repository) {
  int64_t total = 0;
  std::error_code ec;
  for (const auto& model : std::filesystem::directory_iterator(repository, ec)) {
    if (!model.is_directory(ec)) continue;
    for (const auto& file : std::filesystem::directory_iterator(model.path(), ec)) {
      if (file.path().extension() != ".safetensors") continue;
      const auto size = file.file_size(ec);
      if (!ec) total += static_cast<int64_t>(size);
    }
  }
  return total;
}

// The demo model: four 256 x 256 float32 projections and their biases.
constexpr int64_t kDemoModelBytes = 4 * (256 * 256 + 256) * 4;

}  // namespace

int64_t MemoryPlan::EstimateBaseline(int64_t rss_now, const std::string& model_repository,
                                     std::string* source) {
  const int64_t models =
      model_repository.empty() ? kDemoModelBytes : ModelFileBytes(model_repository);
  if (source != nullptr) {
    *source =
        absl::StrCat("resident ", MiB(rss_now), " at start + ", kModelCopies, " x ", MiB(models),
                     " of model files + ", MiB(kRuntimeBytes), " for the runtime");
  }
  return rss_now + kModelCopies * models + kRuntimeBytes;
}

absl::StatusOr<MemoryPlan> MemoryPlan::Make(const MemoryPlanInputs& in) {
  if (in.limit_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory plan: the memory limit must be positive, got ", in.limit_bytes,
                     " bytes (", in.limit_source, ")"));
  }
  if (in.max_inflight_bytes < 0 || in.session_memory_bytes < 0 || in.baseline_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory plan: --max_inflight_bytes (", in.max_inflight_bytes,
        ") and --session_memory_bytes (", in.session_memory_bytes, ") must be >= 0 (0: derived)"));
  }
  // The explicit flags and the baseline alone must fit the limit.
  std::vector<std::string> named;
  int64_t fixed = in.baseline_bytes;
  // An explicit in-flight budget brings the computing batch's cap with it.
  const int64_t explicit_batch =
      std::min(DynamicBatcher::kMaxBatchWeightsBytes, in.max_inflight_bytes / 2);
  if (in.max_inflight_bytes > 0) {
    named.push_back(absl::StrCat("--max_inflight_bytes=", in.max_inflight_bytes,
                                 " (and its batch's ", explicit_batch, ")"));
    fixed += in.max_inflight_bytes + explicit_batch;
  }
  if (in.session_memory_bytes > 0) {
    named.push_back(absl::StrCat("--session_memory_bytes=", in.session_memory_bytes));
    fixed += in.session_memory_bytes;
  }
  if (in.baseline_bytes > in.limit_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "memory plan: the process's baseline alone, ", in.baseline_bytes, " bytes (",
        in.baseline_source, "), is over the memory limit of ", in.limit_bytes, " bytes (",
        in.limit_source, "); serve fewer or smaller models or raise the limit"));
  }
  if (fixed > in.limit_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("memory plan: ", absl::StrJoin(named, " + "), " + the process's baseline ",
                     in.baseline_bytes, " (", in.baseline_source, ") = ", fixed,
                     " bytes, over the memory limit of ", in.limit_bytes, " bytes (",
                     in.limit_source, "); lower those flags or raise the limit"));
  }

  MemoryPlan plan;
  plan.limit_bytes_ = in.limit_bytes;
  plan.limit_source_ = in.limit_source;
  plan.baseline_bytes_ = in.baseline_bytes;
  const int64_t target = static_cast<int64_t>(kTargetShare * static_cast<double>(in.limit_bytes));
  const int64_t room = std::max<int64_t>(0, target - in.baseline_bytes);
  const std::string of_room = absl::StrCat(" of the ", MiB(room), " the baseline leaves of ",
                                           Percent(kTargetShare), " of the limit");

  // Derived budgets: their shares of the room, scaled down together if the
  // explicit ones leave less.
  const bool inflight_derived = in.max_inflight_bytes == 0;
  const bool sessions_derived = in.session_memory_bytes == 0;
  double wanted_share = kReceiveQuotaShare + kWorkspaceShare + kAllocatorShare;
  if (inflight_derived) wanted_share += kInflightShare;
  if (sessions_derived) wanted_share += kSessionShare;
  const int64_t left =
      std::max<int64_t>(0, room - (inflight_derived ? 0 : in.max_inflight_bytes + explicit_batch) -
                               (sessions_derived ? 0 : in.session_memory_bytes));
  const double wanted = wanted_share * static_cast<double>(room);
  const double scale = wanted > static_cast<double>(left) ? left / wanted : 1.0;
  std::string scaled;
  if (scale < 1.0) {
    scaled = absl::StrCat(", scaled to ", Percent(scale), " to fit beside ",
                          absl::StrJoin(named, " and "));
  }
  auto derive = [&](double share) {
    return static_cast<int64_t>(share * scale * static_cast<double>(room));
  };
  auto derived_source = [&](double share) { return absl::StrCat(Percent(share), of_room, scaled); };

  plan.lines_.push_back({"baseline", in.baseline_bytes, in.baseline_source});
  plan.max_inflight_bytes_ = inflight_derived ? derive(kInflightShare) : in.max_inflight_bytes;
  plan.lines_.push_back(
      {"max_inflight_bytes", plan.max_inflight_bytes_,
       inflight_derived ? derived_source(kInflightShare) : std::string("--max_inflight_bytes")});
  plan.grpc_receive_quota_bytes_ = derive(kReceiveQuotaShare);
  std::string quota_source = derived_source(kReceiveQuotaShare);
  if (plan.grpc_receive_quota_bytes_ < in.max_message_bytes) {
    plan.grpc_receive_quota_bytes_ = in.max_message_bytes;
    quota_source = "--max_message_bytes (one largest message; its share was smaller)";
  }
  plan.lines_.push_back({"grpc_receive_quota", plan.grpc_receive_quota_bytes_, quota_source});
  plan.session_memory_bytes_ = sessions_derived ? derive(kSessionShare) : in.session_memory_bytes;
  plan.lines_.push_back(
      {"session_memory_bytes", plan.session_memory_bytes_,
       sessions_derived ? derived_source(kSessionShare) : std::string("--session_memory_bytes")});
  plan.workspace_kept_bytes_ = derive(kWorkspaceShare);
  plan.lines_.push_back(
      {"workspaces_kept", plan.workspace_kept_bytes_, derived_source(kWorkspaceShare)});
  plan.allocator_reserve_bytes_ = derive(kAllocatorShare);
  plan.lines_.push_back(
      {"allocator_reserve", plan.allocator_reserve_bytes_, derived_source(kAllocatorShare)});
  plan.max_batch_weights_bytes_ =
      std::min(DynamicBatcher::kMaxBatchWeightsBytes, plan.max_inflight_bytes_ / 2);
  // The one batch computing holds its working memory (weights, padded
  // inputs, projections, workspaces) beside the in-flight budget.
  plan.lines_.push_back({"max_batch_weights_bytes", plan.max_batch_weights_bytes_,
                         absl::StrCat("half of max_inflight_bytes, at most ",
                                      MiB(DynamicBatcher::kMaxBatchWeightsBytes),
                                      ": the computing batch's working memory, beside it")});

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
    absl::StrAppendFormat(&out, "  %-24s %12d bytes %9s  %s%s\n",
                          line.summed ? line.name : absl::StrCat("(", line.name, ")"), line.bytes,
                          absl::StrCat("(", MiB(line.bytes), ")"), line.source,
                          line.summed ? "" : "; not added to the total");
  }
  absl::StrAppendFormat(&out, "  %-24s %12d bytes %9s  %s of the limit %d bytes\n", "total",
                        total_bytes(), absl::StrCat("(", MiB(total_bytes()), ")"),
                        Percent(static_cast<double>(total_bytes()) / limit_bytes_), limit_bytes_);
  for (const std::string& warning : warnings_) absl::StrAppend(&out, "  warning: ", warning, "\n");
  return out;
}

}  // namespace attention::server
