// Every committed fuzz input through its entry function, in the ordinary test
// suite: the seed corpus (tests/fuzz/corpus/<target>/), large inputs too slow
// to seed the fuzzers with (tests/fuzz/slow/<target>/: about a second each in
// their coverage-instrumented build, milliseconds here) and the inputs that
// once crashed or broke an invariant (tests/fuzz/regressions/<target>/).
// Under build-asan/ (scripts/sanitize.sh) a memory error fails it too.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/fuzz/fuzz_entries.h"

namespace attention::fuzz {
namespace {

struct Target {
  const char* name;
  absl::Status (*entry)(const uint8_t*, size_t);
};

class FuzzRegressionTest : public ::testing::TestWithParam<Target> {};

std::vector<std::filesystem::path> Inputs(const std::string& folder) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(folder, ec)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST_P(FuzzRegressionTest, CommittedInputsAreHandled) {
  const std::string name = GetParam().name;
  const std::vector<std::filesystem::path> corpus =
      Inputs(std::string(ATTENTION_FUZZ_DIR) + "/corpus/" + name);
  EXPECT_FALSE(corpus.empty()) << "no seed corpus for " << name;
  std::vector<std::filesystem::path> all = corpus;
  for (const char* folder : {"/slow/", "/regressions/"}) {
    for (auto& p : Inputs(std::string(ATTENTION_FUZZ_DIR) + folder + name)) all.push_back(p);
  }
  int accepted = 0;
  for (const auto& path : all) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    const std::string data = bytes.str();
    const absl::Status status =
        GetParam().entry(reinterpret_cast<const uint8_t*>(data.data()), data.size());
    EXPECT_FALSE(IsFuzzBug(status)) << path << ": " << status;
    std::cout << path.filename().string() << ": " << status << "\n";
    accepted += status.ok();
  }
  // The seeds exist to reach past the parsers: some of them must be valid.
  EXPECT_GT(accepted, 0) << "no committed input for " << name << " is accepted";
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzRegressionTest,
                         ::testing::Values(Target{"model_dir_fuzzer", FuzzOneModelDir},
                                           Target{"infer_request_fuzzer", FuzzOneInferRequest},
                                           Target{"npy_fuzzer", FuzzOneNpy},
                                           Target{"session_fuzzer", FuzzOneSession},
                                           Target{"oip_request_fuzzer", FuzzOneOipRequest},
                                           Target{"rest_request_fuzzer", FuzzOneRestRequest},
                                           Target{"http_request_fuzzer", FuzzOneHttpRequest}),
                         [](const ::testing::TestParamInfo<Target>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace attention::fuzz
