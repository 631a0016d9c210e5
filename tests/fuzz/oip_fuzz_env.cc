#include "tests/fuzz/oip_fuzz_env.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "tests/fixture/test_util.h"
#include "tests/fuzz/fuzz_repository.h"

namespace attention::fuzz {
namespace {

Environment* MakeEnvironment(const Limits& limits) {
  const std::string dir = StartFuzzProcess("oip_fuzz");
  const std::string serving = absl::StrCat(
      "\"max_queue_delay_us\": 200, \"max_batch_tokens\": ", limits.max_batch_tokens,
      ", \"max_session_tokens\": ", limits.max_session_tokens, ", \"max_sessions\": 3");
  // self: E=8, 2 heads. cross: kdim 6, vdim 4, bias_kv, zero_attn, bfloat16
  // (a sequence on it is a self session on kdim != E: issue 21 item 1).
  // wide: kdim = vdim = 16 > E. half: bfloat16 compute and cache.
  MhaSpec self = testing::SelfAttentionSpec(8, 2);
  MhaSpec wide = self;
  wide.kdim = wide.vdim = 16;
  MhaSpec half = testing::SelfAttentionSpec(12, 3);
  half.add_zero_attn = true;
  half.compute_dtype = DType::kBFloat16;
  testing::WriteModelDir(**MhaModel::Random(self, 1), dir + "/self", serving);
  testing::WriteModelDir(**MhaModel::Random(FuzzCrossSpec(), 2), dir + "/cross", serving);
  testing::WriteModelDir(**MhaModel::Random(wide, 3), dir + "/wide", serving);
  testing::WriteModelDir(**MhaModel::Random(half, 4), dir + "/half",
                         serving + ", \"session_cache_dtype\": \"bfloat16\"");
  server::ServiceOptions service_options;
  service_options.max_response_bytes = limits.max_response_bytes;
  service_options.max_inflight_bytes = limits.max_inflight_bytes;
  FuzzRepository loaded = LoadFuzzRepository(dir, service_options);
  auto* env = new Environment;
  env->metrics = std::move(loaded.metrics);
  env->repository = std::move(loaded.repository);
  env->service = std::move(loaded.path);
  for (const char* name : {"self", "cross", "wide", "half"}) {
    const MhaSpec& s = env->repository->Find(name)->model->spec();
    env->shapes.push_back({name, s.embed_dim, s.kdim, s.vdim});
  }
  return env;
}

}  // namespace

Environment& Env(bool roomy) {
  static Environment* const tight = MakeEnvironment(kTight);
  if (!roomy) return *tight;
  static Environment* const large = MakeEnvironment(kRoomy);
  return *large;
}

}  // namespace attention::fuzz
