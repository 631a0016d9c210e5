// File: tests/fuzz/fuzz_repository.h
//
// What the fuzzers that run requests through the server's request path
// (infer_request_fuzz.cc, oip_fuzz_env.cc) share: the process set-up (one
// OpenMP thread, protobuf's log silenced, a fresh model folder), the
// "cross" model spec, and a repository loaded from that folder with the
// request path over it. Called once per process when a fuzzer makes its
// environment; failures abort (a fuzzer has no test to fail).
#ifndef ATTENTION_TESTS_FUZZ_FUZZ_REPOSITORY_H_
#define ATTENTION_TESTS_FUZZ_FUZZ_REPOSITORY_H_

#include <memory>
#include <string>

#include "core/mha_model.h"
#include "server/batching/model_repository.h"
#include "server/metrics/metrics.h"
#include "server/requests/request_path.h"

namespace attention::fuzz {

// One OpenMP thread; protobuf's log silenced (it logs every string field
// that is not UTF-8, which the server's gRPC refuses the same way, and the
// log would drown the fuzzer); returns a fresh temporary folder
// `<tmp>/<prefix>_XXXXXX` for the models.
std::string StartFuzzProcess(const std::string& prefix);

// The fuzzers' "cross" model: E=8, 2 heads, kdim 6, vdim 4, no input bias,
// add_bias_kv, add_zero_attn, bfloat16 compute.
MhaSpec FuzzCrossSpec();

// What LoadFuzzRepository makes.
struct FuzzRepository {
  std::unique_ptr<server::Metrics> metrics;
  std::unique_ptr<server::ModelRepository> repository;
  std::unique_ptr<server::RequestPath> path;  // Over `repository`.
};

// Loads the models in `dir` (default model "self", no warm-up), removes
// `dir`, and puts a request path with `options` over them.
FuzzRepository LoadFuzzRepository(const std::string& dir, const server::ServiceOptions& options);

}  // namespace attention::fuzz

#endif  // ATTENTION_TESTS_FUZZ_FUZZ_REPOSITORY_H_
