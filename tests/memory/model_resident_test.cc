// What a loaded model version costs in resident memory (issue 36, "one copy
// of the weights"): an E=2048 H=16 model (64 MiB of float32 weights) loaded
// by the repository, as the server loads it, grows the resident set by at
// most 1.3x its file with float32 compute (half that with bfloat16, a
// quarter with int8), and by what the repository counts for it (the
// engine's resident bytes, which --max_model_bytes and the memory plan use)
// within a few MiB. Its own binary: the resident set is the process's.
#include <malloc.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "server/allocator_trimmer.h"
#include "server/batching/model_repository.h"
#include "server/memory_limit.h"
#include "server/metrics/metrics.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kE = 2048;

class ModelResidentTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server::ConfigureAllocator();  // As the server's main() does.
    dir_ = new std::string(::testing::TempDir() + "/model_resident_test");
    std::filesystem::remove_all(*dir_);
    // One float32 file, linked into a folder per compute dtype.
    const std::string f32 = *dir_ + "/files/float32";
    testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(kE, 16), 1), f32);
    malloc_trim(0);
    for (const char* dtype : {"bfloat16", "int8"}) {
      const std::string d = *dir_ + "/files/" + dtype;
      std::filesystem::create_directories(d);
      std::filesystem::create_hard_link(f32 + "/model.safetensors", d + "/model.safetensors");
      std::ofstream(d + "/config.json")
          << R"({"num_heads": 16, "compute_dtype": ")" << dtype << R"("})";
    }
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  // A repository of the given model folders (under files/), each its own model.
  static std::string Repository(const std::string& name, const std::vector<std::string>& dtypes) {
    const std::string repo = *dir_ + "/" + name;
    std::filesystem::remove_all(repo);
    std::filesystem::create_directories(repo);
    for (const std::string& dtype : dtypes) {
      const std::string d = repo + "/" + dtype;
      std::filesystem::create_directories(d);
      for (const char* file : {"config.json", "model.safetensors"}) {
        std::filesystem::create_hard_link(*dir_ + "/files/" + dtype + "/" + file, d + "/" + file);
      }
    }
    return repo;
  }

  static int64_t FileBytes() {
    return static_cast<int64_t>(
        std::filesystem::file_size(*dir_ + "/files/float32/model.safetensors"));
  }

  static std::string* dir_;
};

std::string* ModelResidentTest::dir_ = nullptr;

TEST_F(ModelResidentTest, ALoadedModelHoldsItsWeightsOnce) {
  const int64_t file = FileBytes();
  ASSERT_GT(file, 64 * kMiB);  // Four 2048 x 2048 float32 matrices and the biases.
  server::Metrics metrics("test");
  for (const std::string dtype : {"float32", "bfloat16", "int8"}) {
    const std::string repo = Repository("repo_" + dtype, {dtype});
    malloc_trim(0);
    const int64_t before = server::ResidentBytes();
    server::RepositoryOptions options;
    options.path = repo;
    options.warmup = false;
    auto repository = server::ModelRepository::Load(options, &metrics);
    ASSERT_TRUE(repository.ok()) << repository.status();
    malloc_trim(0);
    const int64_t delta = server::ResidentBytes() - before;
    const int64_t counted = (*repository)->resident_bytes();
    const double ratio = static_cast<double>(delta) / file;
    std::printf("%s: resident set +%.1f MiB = %.2fx the file (%.1f MiB); counted %.1f MiB\n",
                dtype.c_str(), delta / double(kMiB), ratio, file / double(kMiB),
                counted / double(kMiB));
    const double limit = dtype == "float32" ? 1.3 : dtype == "bfloat16" ? 0.65 : 0.4;
    EXPECT_LE(ratio, limit) << dtype;
    // The repository's count (what --max_model_bytes admits) is what the
    // resident set grew by, give or take the batcher and metrics.
    EXPECT_LE(std::abs(delta - counted), 4 * kMiB + file / 32) << dtype;
    repository->reset();
    std::filesystem::remove_all(repo);
  }
}

TEST_F(ModelResidentTest, MaxModelBytesCountsResidentBytes) {
  // A float32 and a bfloat16 version of the model take 1.5x the file
  // resident: both fit 1.6x (two files' bytes would not).
  const int64_t file = FileBytes();
  server::Metrics metrics("test");
  server::RepositoryOptions options;
  options.path = Repository("repo_limit", {"float32", "bfloat16"});
  options.warmup = false;
  options.max_model_bytes = file * 16 / 10;
  auto repository = server::ModelRepository::Load(options, &metrics);
  ASSERT_TRUE(repository.ok()) << repository.status();
  EXPECT_NE((*repository)->Find("float32"), nullptr);
  EXPECT_NE((*repository)->Find("bfloat16"), nullptr);
  EXPECT_LE((*repository)->resident_bytes(), options.max_model_bytes);
  repository->reset();
  std::filesystem::remove_all(options.path);
}

}  // namespace
}  // namespace attention
