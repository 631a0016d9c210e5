// attention.v1.InferRequest bytes through the server's own decode and
// validation (AttentionServiceImpl::Prepare), then, for a small valid
// request, the batcher's compute (RunBatch) beside a companion request, the
// response encoding, and a comparison with the engine's solo result.

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention/v1/attention.pb.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "grpcpp/server_context.h"
#include "server/batching/batch_runner.h"
#include "server/batching/model_repository.h"
#include "server/frontends/grpc/attention_service.h"
#include "server/frontends/grpc/grpc_call.h"
#include "server/metrics/metrics.h"
#include "tests/fixture/test_util.h"
#include "tests/fuzz/fuzz_entries.h"
#include "tests/fuzz/fuzz_repository.h"

namespace attention::fuzz {
namespace {

using server::AttentionServiceImpl;
using server::PendingRequest;
using server::RequestOutcome;

// Requests up to this many query x key pairs (over the batch) are computed.
constexpr int64_t kMaxComputedPairs = 1 << 14;
// Inputs within this magnitude are compared with the solo result (larger
// ones may legitimately overflow differently on different kernel paths).
constexpr float kMaxComparedMagnitude = 16.0f;

// The models and the service, made once per process (and never destroyed:
// the batcher threads idle until exit).
struct Environment {
  std::unique_ptr<server::Metrics> metrics;
  std::unique_ptr<server::ModelRepository> repository;
  std::unique_ptr<server::RequestPath> path;
  std::unique_ptr<AttentionServiceImpl> service;
};

Environment* MakeEnvironment() {
  const std::string dir = StartFuzzProcess("infer_fuzz");
  testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(8, 2), 1), dir + "/self");
  testing::WriteModelDir(**MhaModel::Random(FuzzCrossSpec(), 2), dir + "/cross");
  server::ServiceOptions service_options;
  service_options.max_response_bytes = 1 << 20;  // Small, so the size checks are reached.
  FuzzRepository loaded = LoadFuzzRepository(dir, service_options);
  auto* env = new Environment;
  env->metrics = std::move(loaded.metrics);
  env->repository = std::move(loaded.repository);
  env->path = std::move(loaded.path);
  env->service = std::make_unique<AttentionServiceImpl>(env->path.get());
  return env;
}

Environment& Env() {
  static Environment* const env = MakeEnvironment();
  return *env;
}

// A fixed request of another length to share the batch with.
struct Companion {
  Tensor query, key, value;
  std::unique_ptr<PendingRequest> pending;
};

absl::StatusOr<Companion> MakeCompanion(const MhaEngine& engine, bool self_attention) {
  const MhaSpec& s = engine.model().spec();
  Companion c;
  c.query = Tensor(DType::kFloat32, {1, 3, s.embed_dim});
  c.key = Tensor(DType::kFloat32, {1, 2, s.kdim});
  c.value = Tensor(DType::kFloat32, {1, 2, s.vdim});
  for (Tensor* t : {&c.query, &c.key, &c.value}) {
    for (int64_t i = 0; i < t->num_elements(); ++i)
      t->mutable_as<float>()[i] = 0.1f * (i % 7) - 0.3f;
  }
  c.pending = std::make_unique<PendingRequest>();
  MhaInputs& in = c.pending->inputs;
  in.query = c.query.view();
  if (!self_attention) {
    in.key = c.key.view();
    in.value = c.value.view();
  }
  in.need_weights = true;
  ASSIGN_OR_RETURN(c.pending->call, engine.Validate(in));
  return c;
}

bool WithinMagnitude(const std::optional<TensorView>& t, bool mask) {
  if (!t || t->dtype == DType::kBool) return true;
  for (int64_t i = 0; i < t->num_elements(); ++i) {
    const float v = LoadAsFloat(t->dtype, t->data, i);
    if (mask && std::isinf(v) && v < 0) continue;  // -inf masks a key.
    if (!(std::abs(v) <= kMaxComparedMagnitude)) return false;
  }
  return true;
}

bool Comparable(const MhaInputs& in) {
  return WithinMagnitude(in.query, false) && WithinMagnitude(in.key, false) &&
         WithinMagnitude(in.value, false) && WithinMagnitude(in.key_padding_mask, true) &&
         WithinMagnitude(in.attn_mask, true);
}

// One unit in the last place of `b` in the 16-bit `dtype` (0 for float32):
// the batched and the solo result may round to neighbours there, whatever
// the compute tolerance (a float32 model answering in bfloat16 showed 1.21875
// against 1.22656).
double OutputUlp(DType dtype, float b) {
  if (b == 0.0f || !std::isfinite(b)) return 0.0;
  if (dtype == DType::kBFloat16) return std::ldexp(1.0, std::ilogb(b) - 7);
  if (dtype == DType::kFloat16) return std::ldexp(1.0, std::max(std::ilogb(b), -14) - 10);
  return 0.0;
}

// `actual` (wire bytes of `dtype`) against `expected`, element by element:
// within `tolerance` relative (plus 1 absolute) and one unit of the wire
// dtype.
absl::Status Compare(absl::string_view what, const server::OutputTensor& actual,
                     const Tensor& expected, double tolerance) {
  if (actual.shape != expected.shape() || actual.dtype != expected.dtype()) {
    return absl::InternalError(
        absl::StrCat("fuzz invariant: ", what, " batched is ", DTypeName(actual.dtype), " ",
                     ShapeToString(actual.shape), ", solo ", DTypeName(expected.dtype()), " ",
                     ShapeToString(expected.shape())));
  }
  for (int64_t i = 0; i < expected.num_elements(); ++i) {
    const float a = LoadAsFloat(actual.dtype, actual.bytes.data(), i);
    const float b = LoadAsFloat(expected.dtype(), expected.data(), i);
    if (std::isnan(a) != std::isnan(b) ||
        (!std::isnan(b) &&
         !(std::abs(a - b) <= tolerance * (1.0 + std::abs(b)) + OutputUlp(actual.dtype, b)))) {
      return absl::InternalError(
          absl::StrCat("fuzz invariant: ", what, "[", i, "] batched ", a, ", solo ", b));
    }
  }
  return absl::OkStatus();
}

// Computes a prepared request as the batcher would, with a companion, and
// checks both against their solo results.
absl::Status Compute(const server::ServedModel& model, std::unique_ptr<PendingRequest> request,
                     int64_t max_response_bytes) {
  const MhaEngine& engine = *model.engine;
  const MhaCall& call = request->call;
  const int64_t total_keys = call.keys + engine.model().spec().extra_keys();
  if (call.batch * call.queries * total_keys > kMaxComputedPairs) return absl::OkStatus();
  ASSIGN_OR_RETURN(Companion companion, MakeCompanion(engine, call.self_attention));
  std::vector<std::unique_ptr<PendingRequest>> batch;
  batch.push_back(std::move(request));
  batch.push_back(std::move(companion.pending));
  server::BatchStats stats;
  std::vector<RequestOutcome> outcomes = server::RunBatch(engine, batch, &stats);
  if (outcomes.size() != batch.size()) {
    return absl::InternalError(absl::StrCat("fuzz invariant: RunBatch returned ", outcomes.size(),
                                            " outcomes for ", batch.size(), " requests"));
  }
  const double tolerance = engine.model().spec().compute_dtype == DType::kFloat32 ? 1e-3 : 2e-2;
  for (size_t i = 0; i < batch.size(); ++i) {
    RequestOutcome& outcome = outcomes[i];
    RETURN_IF_ERROR(outcome.status);
    const MhaInputs& in = batch[i]->inputs;
    const std::string what = i == 0 ? "output" : "companion output";
    if (Comparable(in)) {
      ASSIGN_OR_RETURN(const MhaOutputs solo, engine.Forward(in));
      RETURN_IF_ERROR(Compare(what, outcome.output, solo.output, tolerance));
      if (in.need_weights) {
        if (!outcome.attn_weights || !solo.attn_weights) {
          return absl::InternalError(absl::StrCat("fuzz invariant: ", what, " has no weights"));
        }
        RETURN_IF_ERROR(
            Compare(what + " weights", *outcome.attn_weights, *solo.attn_weights, tolerance));
      }
    }
    v1::InferResponse response;
    RETURN_IF_ERROR(server::EncodeOutcome(outcome, max_response_bytes, &response));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FuzzOneInferRequest(const uint8_t* data, size_t size) {
  Environment& env = Env();
  auto request = std::make_shared<v1::InferRequest>();
  if (!request->ParseFromArray(data, static_cast<int>(size))) {
    // gRPC refuses the call before the service sees it.
    return absl::InvalidArgumentError("not an attention.v1.InferRequest");
  }
  grpc::CallbackServerContext context;
  AttentionServiceImpl::Prepared prepared;
  RETURN_IF_ERROR(env.service->Prepare(
      *request, request, *server::CallOf(&context, server::Method::kInfer), &prepared));
  return Compute(*prepared.model, std::move(prepared.pending),
                 env.path->options().max_response_bytes);
}

}  // namespace attention::fuzz
