// File: tests/model_lifecycle/churn/churn_calls.h
//
// ChurnCalls: one call of every kind the server answers (attention.v1 Infer
// and InferStream, sessions and SessionStream, the inference protocol's
// ModelInfer, ModelStreamInfer and sequences, REST infer, metadata), each
// checked as the churn test's invariants say: its code is one of
// kAllowedCodes, and an OK answer equals the reference of the model version
// it names (within 1e-4). Calls are counted by kind and code.
//
// Thread-safe: any number of threads may call Run() at once. The versions'
// models are registered with AddVersion() before they can serve.
#ifndef ATTENTION_TESTS_MODEL_LIFECYCLE_CHURN_CHURN_CALLS_H_
#define ATTENTION_TESTS_MODEL_LIFECYCLE_CHURN_CHURN_CALLS_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <random>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "core/mha_model.h"
#include "core/tensor.h"
#include "inference/grpc_predict_v2.grpc.pb.h"

namespace attention::churn_test {

// The kinds of call Run() makes.
enum class Kind {
  kInfer,
  kInferStream,
  kSession,
  kSessionStream,
  kModelInfer,
  kModelStreamInfer,
  kSequence,
  kRest,
  kMetadata,
  kCount
};
const char* KindName(Kind kind);

// Every code a call may get while versions change under it and a drain may
// start: OK; NOT_FOUND (no version serving for a moment, a session or
// sequence ended with its version, a version named that is gone);
// UNAVAILABLE (not ready, draining, shut down); CANCELLED (a stream cut by
// the drain's deadline); FAILED_PRECONDITION (a sequence step whose
// expected length its restarted session no longer has).
bool Allowed(grpc::StatusCode code);

class ChurnCalls {
 public:
  // Calls go to `channel` (gRPC) and 127.0.0.1:`http_port` (REST), model "m".
  ChurnCalls(std::shared_ptr<grpc::Channel> channel, int http_port);

  // Registers version `version`'s model, the reference of its answers.
  void AddVersion(int64_t version, std::shared_ptr<const MhaModel> model);
  // Makes one call of `kind` with inputs drawn from `rng`, checks it and
  // counts it. Returns its code.
  grpc::StatusCode Run(Kind kind, std::mt19937& rng);

  // Calls of `kind` answered with `code` so far.
  int64_t Count(Kind kind, grpc::StatusCode code) const;
  // "Infer: OK 12, NOT_FOUND 3; ..." for the log.
  std::string Summary() const;
  // Answers that differed from their version's reference, or were shaped wrong.
  int64_t wrong() const;

 private:
  std::shared_ptr<const MhaModel> Model(int64_t version) const;
  // Checks an OK answer's output (shape like `query`'s rows) against version
  // `version`'s stateless result for `query`; counts a wrong one.
  void CheckStateless(int64_t version, const Tensor& query, const Tensor& output, const char* what);
  // Checks rows [from, from + n) of a causal pass over `all` (1, T, E) on
  // `version` against `got` (n, E).
  void CheckCausal(int64_t version, const Tensor& all, int64_t from, const Tensor& got,
                   const char* what);
  void Wrong(const std::string& what);

  grpc::StatusCode Infer(std::mt19937& rng);
  grpc::StatusCode InferStream(std::mt19937& rng);
  grpc::StatusCode Session(std::mt19937& rng, bool stream);
  grpc::StatusCode ModelInfer(std::mt19937& rng, bool stream);
  grpc::StatusCode Sequence(std::mt19937& rng);
  grpc::StatusCode Rest(std::mt19937& rng);
  grpc::StatusCode Metadata(std::mt19937& rng);

  const std::shared_ptr<grpc::Channel> channel_;
  const int http_port_;
  std::unique_ptr<v1::AttentionService::Stub> attention_;
  std::unique_ptr<v1::SessionService::Stub> sessions_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> oip_;
  mutable absl::Mutex mu_;
  std::map<int64_t, std::shared_ptr<const MhaModel>> models_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, int>, int64_t> counts_ ABSL_GUARDED_BY(mu_);
  int64_t wrong_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace attention::churn_test

#endif  // ATTENTION_TESTS_MODEL_LIFECYCLE_CHURN_CHURN_CALLS_H_
