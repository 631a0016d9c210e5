// File: tests/session_test_server.h
//
// The in-process server of the session tests: two models, "small" (E=32,
// H=4, self sessions, max_session_tokens 64) and "cross" (kdim 12, vdim 10,
// add_bias_kv, add_zero_attn), in a model folder of the calling process's own.
#ifndef ATTENTION_TESTS_SESSION_TEST_SERVER_H_
#define ATTENTION_TESTS_SESSION_TEST_SERVER_H_

#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "tests/test_util.h"

namespace attention {

inline constexpr int64_t kE = 32;  // "small": E=32, H=4.

// A server with two models: "small" (self sessions, max_session_tokens 64)
// and "cross" (kdim 12, vdim 10, add_bias_kv, add_zero_attn).
inline server::AttentionServer* StartServer(const std::string& name, int64_t memory_bytes,
                                            absl::Duration evict_grace) {
  const std::string dir = ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(kE, 4), 1), dir + "/small",
                         "\"max_batch_size\": 16, \"max_queue_delay_us\": 2000, "
                         "\"max_session_tokens\": 64");
  MhaSpec cross = testing::SelfAttentionSpec(16, 2);
  cross.kdim = 12;
  cross.vdim = 10;
  cross.add_bias_kv = true;
  cross.add_zero_attn = true;
  testing::WriteModelDir(**MhaModel::Random(cross, 2), dir + "/cross");
  server::ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;
  options.repository.path = dir;
  options.repository.default_model = "small";
  options.repository.compute_threads = 2;
  options.repository.warmup = false;
  options.sessions.memory_bytes = memory_bytes;
  options.sessions.evict_grace = evict_grace;
  auto server = server::AttentionServer::Listen(options);
  EXPECT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE((*server)->LoadModels().ok());
  return server->release();
}

}  // namespace attention

#endif  // ATTENTION_TESTS_SESSION_TEST_SERVER_H_
