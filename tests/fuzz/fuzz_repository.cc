// File: tests/fuzz/fuzz_repository.cc
#include "tests/fuzz/fuzz_repository.h"

#include <omp.h>
#include <stdlib.h>

#include <filesystem>

#include "google/protobuf/stubs/logging.h"
#include "tests/fixture/test_util.h"

namespace attention::fuzz {

std::string StartFuzzProcess(const std::string& prefix) {
  omp_set_num_threads(1);
  google::protobuf::SetLogHandler(nullptr);
  std::string dir = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
  if (mkdtemp(dir.data()) == nullptr) abort();
  return dir;
}

MhaSpec FuzzCrossSpec() {
  MhaSpec cross = testing::SelfAttentionSpec(8, 2);
  cross.kdim = 6;
  cross.vdim = 4;
  cross.bias = false;
  cross.add_bias_kv = true;
  cross.add_zero_attn = true;
  cross.compute_dtype = DType::kBFloat16;
  return cross;
}

FuzzRepository LoadFuzzRepository(const std::string& dir, const server::ServiceOptions& options) {
  FuzzRepository out;
  out.metrics = std::make_unique<server::Metrics>("fuzz");
  server::RepositoryOptions repository_options;
  repository_options.path = dir;
  repository_options.default_model = "self";
  repository_options.warmup = false;
  auto repository = server::ModelRepository::Load(repository_options, out.metrics.get());
  std::filesystem::remove_all(dir);
  if (!repository.ok()) abort();
  out.repository = std::move(*repository);
  out.path = std::make_unique<server::RequestPath>(out.metrics.get(), options);
  out.path->SetRepository(out.repository.get());
  return out;
}

}  // namespace attention::fuzz
