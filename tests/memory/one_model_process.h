// File: tests/memory/one_model_process.h
//
// OneModelProcess: what the memory tests' attention-server processes share
// (flood_test's descriptor flood, receive_test): a fresh model folder with
// one model "m" (E=32, H=4), the flags serving it on one thread without
// warm-up, and ServerProcessOptions sending the server's standard error to
// <folder>/server.log. Test-only; one test's object.
#ifndef ATTENTION_TESTS_MEMORY_ONE_MODEL_PROCESS_H_
#define ATTENTION_TESTS_MEMORY_ONE_MODEL_PROCESS_H_

#include <string>
#include <vector>

#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention::testing {

struct OneModelProcess {
  explicit OneModelProcess(const std::string& name) : models(name) {
    models.Add("m", SelfAttentionSpec(32, 4), 1);
    options.stderr_path = models.path() + "/server.log";
  }

  // --model_repository=<folder> --threads=1 --warmup=false, then `extra`.
  std::vector<std::string> Flags(const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> flags = {"--model_repository=" + models.path(), "--threads=1",
                                      "--warmup=false"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return flags;
  }

  ModelFolder models;
  ServerProcessOptions options;
};

}  // namespace attention::testing

#endif  // ATTENTION_TESTS_MEMORY_ONE_MODEL_PROCESS_H_
