// attention-client against live attention-servers, for the walls a new user
// still met in issue 38's second walkthrough: the decode load's progress and
// summary count only the sessions that are ready (and with none ready it
// exits 1 with the prefill's error and no table). Every assertion is on the
// text; nothing is timed (the flood runs for 3 s, and only its error codes
// are checked). infer's errors name the model asked for; a
// token only in --admin_tokens_file is told it must be in --auth_tokens_file;
// a flood past the gRPC receive quota is refused, never UNAVAILABLE.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/clients/cli_test_util.h"
#include "tests/fixture/server_test_util.h"

namespace attention {
namespace {

using ::testing::HasSubstr;
using testing::NewDir;
using ::testing::Not;
using testing::RunClient;

// A server that holds 2 sessions of at most 16 tokens: 2 of 4 sessions are
// created (none is idle long enough to be evicted); a 20-token context fails
// every prefill.
TEST(ClientCliDecodeLoadTest, CountsOnlyReadySessionsAndStopsWhenNoneIs) {
  testing::ServerProcess server(
      ATTENTION_SERVER_BINARY,
      {"--max_sessions=2", "--max_session_tokens=16", "--session_evict_grace_s=3600"});
  ASSERT_TRUE(server.ok());
  const std::string at = " --server=" + server.target();
  std::string out;
  EXPECT_EQ(RunClient("load --sessions=4 --context=4 --steps=3" + at, &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("2 of 4 sessions failed to be created or prefilled"));
  EXPECT_THAT(out, HasSubstr("decode load: 2 sessions stepping 3 tokens each"));
  EXPECT_THAT(out, HasSubstr("decoded 6/6 tokens")) << out;
  EXPECT_THAT(out, HasSubstr("decode load: 2 sessions x 3 steps after a 4-token context"));
  EXPECT_THAT(out, HasSubstr("2 of 4 sessions failed to start"));

  EXPECT_EQ(RunClient("load --sessions=2 --context=20 --steps=3" + at, &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("2 of 2 sessions failed to be created or prefilled; first error:"));
  EXPECT_THAT(out, HasSubstr("no session is ready, so no step ran")) << out;
  EXPECT_THAT(out, Not(HasSubstr("stepping"))) << out;
  EXPECT_THAT(out, Not(HasSubstr("tokens/s"))) << out;
  EXPECT_EQ(server.Stop(), 0);
}

// A token only in --admin_tokens_file is refused as unknown (every call
// authenticates against --auth_tokens_file first), and the refusal says an
// admin token must be there too; a server without an admin file does not.
TEST(ClientCliAdminTokenTest, RefusalSaysAnAdminTokenMustAlsoBeAnAuthToken) {
  const std::string dir = NewDir("client_cli_admin");
  std::string out;
  ASSERT_EQ(
      testing::RunCommand("printf user | sha256sum | sed 's/ .*/ alice */' > " + dir +
                              "/tokens && printf admin | sha256sum | sed 's/ .*/ root */' > " +
                              dir + "/admin",
                          &out),
      0)
      << out;
  std::ofstream(dir + "/admin_token") << "admin\n";
  testing::ServerProcess server(ATTENTION_SERVER_BINARY, {"--auth_tokens_file=" + dir + "/tokens",
                                                          "--admin_tokens_file=" + dir + "/admin"});
  ASSERT_TRUE(server.ok());
  EXPECT_EQ(
      RunClient("models --token_file=" + dir + "/admin_token --server=" + server.target(), &out),
      1);
  EXPECT_THAT(out, HasSubstr("unknown token"));
  EXPECT_THAT(out, HasSubstr("(an admin token must also be in --auth_tokens_file)")) << out;
  EXPECT_EQ(server.Stop(), 0);
  testing::ServerProcess plain(ATTENTION_SERVER_BINARY, {"--auth_tokens_file=" + dir + "/tokens"});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(
      RunClient("models --token_file=" + dir + "/admin_token --server=" + plain.target(), &out), 1);
  EXPECT_THAT(out, HasSubstr("unknown token"));
  EXPECT_THAT(out, Not(HasSubstr("admin token"))) << out;
  EXPECT_EQ(plain.Stop(), 0);
  std::filesystem::remove_all(dir);
}

// infer's error names the model the user asked for, not the RPC it called.
TEST(ClientCliInferTest, ModelErrorNamesTheModel) {
  std::string out;
  EXPECT_EQ(RunClient("infer --model=demo --deadline_ms=3000 --server=127.0.0.1:1", &out), 1)
      << out;
  EXPECT_THAT(out, HasSubstr("attention-client: infer: cannot read model 'demo': UNAVAILABLE"));
  EXPECT_THAT(out, Not(HasSubstr("GetModel failed"))) << out;
  EXPECT_EQ(RunClient("infer --deadline_ms=3000 --server=127.0.0.1:1", &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("infer: cannot read the server's default model: UNAVAILABLE"));
}

// A flood of 16 MiB requests past the server's gRPC receive quota (64 MiB):
// gRPC sheds load by cancelling calls (RESOURCE_EXHAUSTED), which once took
// the channel's health-check Watch with them, and the channel then failed
// every call UNAVAILABLE ("health check call failed") for its backoff: 298
// of the container test's flood in stop 42's CI, and 32-396 of 700-950
// requests in this test (3 runs of 3). A numeric address names one server and is not
// health-checked: every request is answered by the server (here refused: each needs more working
// memory than the server allows a batch).
TEST(ClientCliFloodTest, AFloodPastTheReceiveQuotaIsRefusedNotUnavailable) {
  testing::ServerProcess server(ATTENTION_SERVER_BINARY, {"--grpc_receive_quota_bytes=67108864",
                                                          "--max_batch_working_bytes=67108864"});
  ASSERT_TRUE(server.ok());
  const std::string json = NewDir("client_cli_flood") + "/load.json";
  std::string out;
  // Exits 1: every request failed (was refused).
  EXPECT_EQ(RunClient("load --concurrency=32 --seq_len=16384 --duration=3s --deadline_ms=20000"
                      " --json=" +
                          json + " --server=" + server.target(),
                      &out),
            1)
      << out;
  std::ifstream in(json);
  ASSERT_TRUE(in.good()) << out;
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j.size(), 1u);
  int64_t refused = 0;
  for (const auto& [code, count] : j[0]["errors"].items()) {
    EXPECT_THAT(code, ::testing::AnyOf("RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"))
        << count << " requests: " << j.dump();
    refused += count.get<int64_t>();
  }
  EXPECT_GT(refused, 0) << j.dump();  // The flood was refused, not computed.
  EXPECT_EQ(server.Stop(), 0);
  std::filesystem::remove_all(std::filesystem::path(json).parent_path());
}

}  // namespace
}  // namespace attention
