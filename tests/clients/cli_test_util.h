// File: tests/clients/cli_test_util.h
//
// Helpers of the attention-client process tests (clients_cli_test): running
// the CLI binary and a fresh scratch folder. Header-only; stateless. (The
// in-process tests' ModelFolder makes such folders too, but lives with the
// server's test library, which these tests do not link.)
#ifndef ATTENTION_TESTS_CLIENTS_CLI_TEST_UTIL_H_
#define ATTENTION_TESTS_CLIENTS_CLI_TEST_UTIL_H_

#include <unistd.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "tests/fixture/server_test_util.h"

namespace attention::testing {

// Runs attention-client with `args` (a shell fragment): its exit code, and
// its stdout and stderr in `out`.
inline int RunClient(const std::string& args, std::string* out) {
  return RunCommand(std::string(ATTENTION_CLIENT_BINARY) + " " + args, out);
}

// A fresh, empty folder `TempDir()/<name>_<pid>`.
inline std::string NewDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace attention::testing

#endif  // ATTENTION_TESTS_CLIENTS_CLI_TEST_UTIL_H_
