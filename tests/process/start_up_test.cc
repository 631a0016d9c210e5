// attention-server's start-up as a process (issue 38): --exit_on_error
// stops the start-up on a bad model folder and names it (without it the
// server serves the good models: model_lifecycle_bad_folder_test).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/mha_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Ran {
  int exit_code = -1;  // -1: killed by a signal.
  std::string output;  // Standard output and error.
};

// attention-server with `args` on free ports (0) and metrics off, to its
// exit; the test's timeout bounds one that does not exit.
Ran RunServer(const std::string& args) {
  const std::string command = std::string(ATTENTION_SERVER_BINARY) +
                              " --host=127.0.0.1 --port=0 --metrics_port=0 --http_port=0 " + args +
                              " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  Ran ran;
  if (pipe == nullptr) return ran;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) ran.output.append(buffer, n);
  const int status = pclose(pipe);
  ran.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return ran;
}

TEST(StartUpTest, ExitOnErrorStopsTheStartUpNamingTheBadFolder) {
  const std::string repo = ::testing::TempDir() + "/start_up_" + std::to_string(getpid());
  std::filesystem::remove_all(repo);
  auto model = *MhaModel::Random(testing::SelfAttentionSpec(32, 4), 1);
  testing::WriteModelDir(*model, repo + "/good");
  testing::WriteModelDir(*model, repo + "/bad", "\"embeddim\": 32");
  const Ran ran = RunServer("--model_repository=" + repo + " --exit_on_error --warmup=false");
  EXPECT_NE(ran.exit_code, 0) << ran.output;
  EXPECT_THAT(ran.output, HasSubstr("cannot load models: model 'bad'"));
  EXPECT_THAT(ran.output, HasSubstr(repo + "/bad"));
  EXPECT_THAT(ran.output, HasSubstr("unknown key 'embeddim'"));
  EXPECT_THAT(ran.output, Not(HasSubstr("ready: serving")));
  std::filesystem::remove_all(repo);
}

}  // namespace
}  // namespace attention
