// File: tests/fuzz/oip_fuzz_env.h
//
// The servers of the Open Inference Protocol fuzzer (oip_request_fuzz.cc):
// four small models in a repository with its batchers, and the attention
// service over them, without gRPC. Sessions are made per input by the
// fuzzer itself.
//
// Made once per process on first use and never destroyed (the batcher
// threads idle until exit); thread-safe to use as the server is.
#ifndef ATTENTION_TESTS_FUZZ_OIP_FUZZ_ENV_H_
#define ATTENTION_TESTS_FUZZ_OIP_FUZZ_ENV_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "server/batching/model_repository.h"
#include "server/metrics/metrics.h"
#include "server/requests/request_path.h"
#include "tests/fuzz/oip_request_gen.h"

namespace attention::fuzz {

// Two servers: a tight one, whose small limits the size checks reach, and a
// roomy one, whose large requests allocate more than the working estimates'
// fixed allowances (oneDNN's 4 MiB scratchpad each), so that allocated <=
// admitted is tested where an uncounted buffer shows.
struct Limits {
  int64_t max_response_bytes, max_inflight_bytes, max_batch_tokens, max_session_tokens;
};
constexpr Limits kTight = {8 << 10, 64 << 10, 64, 96};
constexpr Limits kRoomy = {64 << 20, int64_t{1} << 30, 1024, 2048};

// The models ("self" is the default), the service and its repository.
struct Environment {
  std::unique_ptr<server::Metrics> metrics;
  std::unique_ptr<server::ModelRepository> repository;
  std::unique_ptr<server::RequestPath> service;  // The request path.
  std::vector<OipModelShape> shapes;
};

// The tight server, or the roomy one. Its models: "self" (E=8, 2 heads),
// "cross" (kdim 6, vdim 4, add_bias_kv, add_zero_attn, bfloat16), "wide"
// (kdim = vdim = 16 > E) and "half" (E=12, 3 heads, bfloat16 compute and
// session cache), each with at most 3 sessions.
Environment& Env(bool roomy);

}  // namespace attention::fuzz

#endif  // ATTENTION_TESTS_FUZZ_OIP_FUZZ_ENV_H_
