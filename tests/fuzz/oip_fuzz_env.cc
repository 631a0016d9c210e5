#include "tests/fuzz/oip_fuzz_env.h"

#include <omp.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"
#include "tests/fixture/test_util.h"

namespace attention::fuzz {
namespace {

Environment* MakeEnvironment(const Limits& limits) {
  omp_set_num_threads(1);
  google::protobuf::SetLogHandler(nullptr);  // Non-UTF-8 strings would flood the log.
  std::string dir = (std::filesystem::temp_directory_path() / "oip_fuzz_XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) abort();
  const std::string serving = absl::StrCat(
      "\"max_queue_delay_us\": 200, \"max_batch_tokens\": ", limits.max_batch_tokens,
      ", \"max_session_tokens\": ", limits.max_session_tokens, ", \"max_sessions\": 3");
  // self: E=8, 2 heads. cross: kdim 6, vdim 4, bias_kv, zero_attn, bfloat16
  // (a sequence on it is a self session on kdim != E: issue 21 item 1).
  // wide: kdim = vdim = 16 > E. half: bfloat16 compute and cache.
  MhaSpec self = testing::SelfAttentionSpec(8, 2);
  MhaSpec cross = self;
  cross.kdim = 6;
  cross.vdim = 4;
  cross.bias = false;
  cross.add_bias_kv = true;
  cross.add_zero_attn = true;
  cross.compute_dtype = DType::kBFloat16;
  MhaSpec wide = self;
  wide.kdim = wide.vdim = 16;
  MhaSpec half = testing::SelfAttentionSpec(12, 3);
  half.add_zero_attn = true;
  half.compute_dtype = DType::kBFloat16;
  testing::WriteModelDir(**MhaModel::Random(self, 1), dir + "/self", serving);
  testing::WriteModelDir(**MhaModel::Random(cross, 2), dir + "/cross", serving);
  testing::WriteModelDir(**MhaModel::Random(wide, 3), dir + "/wide", serving);
  testing::WriteModelDir(**MhaModel::Random(half, 4), dir + "/half",
                         serving + ", \"session_cache_dtype\": \"bfloat16\"");
  auto* env = new Environment;
  env->metrics = std::make_unique<server::Metrics>("fuzz");
  server::RepositoryOptions options;
  options.path = dir;
  options.default_model = "self";
  options.warmup = false;
  auto repository = server::ModelRepository::Load(options, env->metrics.get());
  std::filesystem::remove_all(dir);
  if (!repository.ok()) abort();
  env->repository = std::move(*repository);
  server::ServiceOptions service_options;
  service_options.max_response_bytes = limits.max_response_bytes;
  service_options.max_inflight_bytes = limits.max_inflight_bytes;
  env->service = std::make_unique<server::RequestPath>(env->metrics.get(), service_options);
  env->service->SetRepository(env->repository.get());
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
