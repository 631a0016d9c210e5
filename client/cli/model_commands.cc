#include "client/cli/model_commands.h"

#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/client_util.h"
#include "inference/grpc_predict_v2.grpc.pb.h"

namespace attention::client {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "attention-client: %s\n", message.c_str());
  return 1;
}

std::unique_ptr<v1::AttentionService::Stub> Stub(const ModelCommandOptions& o) {
  return v1::AttentionService::NewStub(MakeChannel(o.target, o.lb_policy));
}

}  // namespace

std::string VersionStates(const v1::ModelInfo& model) {
  std::vector<std::string> parts;
  for (const v1::ModelVersionState& v : model.versions()) {
    parts.push_back(absl::StrCat(v.version(), ":", v.state()));
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, " ");
}

int ListModels(const ModelCommandOptions& o) {
  auto stub = Stub(o);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, o.deadline_ms);
  v1::ListModelsResponse response;
  const grpc::Status status = stub->ListModels(&ctx, {}, &response);
  if (!status.ok()) return Fail(DescribeFailure("ListModels", status, o.target, o.deadline_ms));
  std::printf("%-16s %7s %6s %5s %5s %5s %5s %7s %9s %9s | %9s %10s %9s %10s | %s\n", "name",
              "version", "embed", "heads", "kdim", "vdim", "bias", "bias_kv", "zero_attn",
              "compute", "max_batch", "max_tokens", "delay_us", "max_queue", "versions (state)");
  std::vector<std::string> reasons;
  for (const v1::ModelInfo& m : response.models()) {
    const std::string name = m.name() + (m.is_default() ? " *" : "");
    std::printf("%-16s %7ld %6ld %5ld %5ld %5ld %5s %7s %9s %9s | %9ld %10ld %9ld %10ld | %s\n",
                name.c_str(), static_cast<long>(m.version()), static_cast<long>(m.embed_dim()),
                static_cast<long>(m.num_heads()), static_cast<long>(m.kdim()),
                static_cast<long>(m.vdim()), m.bias() ? "yes" : "no",
                m.add_bias_kv() ? "yes" : "no", m.add_zero_attn() ? "yes" : "no",
                m.compute_dtype() == v1::DATA_TYPE_BFLOAT16 ? "bfloat16" : "float32",
                static_cast<long>(m.batching().max_batch_size()),
                static_cast<long>(m.batching().max_batch_tokens()),
                static_cast<long>(m.batching().max_queue_delay_us()),
                static_cast<long>(m.batching().max_queue_size()), VersionStates(m).c_str());
    for (const v1::ModelVersionState& v : m.versions()) {
      if (!v.reason().empty()) {
        reasons.push_back(
            absl::StrCat(m.name(), " version ", v.version(), " ", v.state(), ": ", v.reason()));
      }
    }
  }
  std::printf("(* = default model; version: the one a request without --model_version gets)\n");
  for (const std::string& r : reasons) std::printf("%s\n", r.c_str());
  return 0;
}

int ShowRepository(const ModelCommandOptions& o) {
  auto stub = inference::GRPCInferenceService::NewStub(MakeChannel(o.target, o.lb_policy));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, o.deadline_ms);
  inference::RepositoryIndexResponse response;
  const grpc::Status status = stub->RepositoryIndex(&ctx, {}, &response);
  if (!status.ok()) {
    return Fail(DescribeFailure("RepositoryIndex", status, o.target, o.deadline_ms));
  }
  std::printf("%-24s %7s %-11s %s\n", "name", "version", "state", "reason");
  for (const auto& m : response.models()) {
    std::printf("%-24s %7s %-11s %s\n", m.name().c_str(),
                m.version().empty() ? "-" : m.version().c_str(), m.state().c_str(),
                m.reason().c_str());
  }
  if (response.models().empty()) std::printf("(the repository holds no model)\n");
  return 0;
}

int LoadModel(const ModelCommandOptions& o, const std::string& model) {
  auto stub = Stub(o);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, o.deadline_ms);
  v1::LoadModelRequest request;
  request.set_name(model);
  v1::LoadModelResponse response;
  std::fprintf(stderr, "loading model '%s' (up to --deadline_ms=%ld)...\n", model.c_str(),
               static_cast<long>(o.deadline_ms));
  const grpc::Status status = stub->LoadModel(&ctx, request, &response);
  if (!status.ok()) return Fail(DescribeFailure("LoadModel", status, o.target, o.deadline_ms));
  std::printf("loaded model '%s': version(s) %s serving\n", model.c_str(),
              absl::StrJoin(response.versions(), ", ").c_str());
  return 0;
}

int UnloadModel(const ModelCommandOptions& o, const std::string& model) {
  auto stub = Stub(o);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, o.deadline_ms);
  v1::UnloadModelRequest request;
  request.set_name(model);
  v1::UnloadModelResponse response;
  const grpc::Status status = stub->UnloadModel(&ctx, request, &response);
  if (!status.ok()) return Fail(DescribeFailure("UnloadModel", status, o.target, o.deadline_ms));
  std::printf("unloaded model '%s': no version of it serves\n", model.c_str());
  return 0;
}

}  // namespace attention::client
