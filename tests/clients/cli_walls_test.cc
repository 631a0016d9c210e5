// attention-client against live attention-servers, for the walls a new user
// still met in issue 38's second walkthrough: the decode load's progress and
// summary count only the sessions that are ready (and with none ready it
// exits 1 with the prefill's error and no table). Every assertion is on the
// text; nothing is timed. infer's errors name the model asked for.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/server_test_util.h"

namespace attention {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// attention-client with `args` (a shell fragment): its exit code; its stdout
// and stderr in `out`.
int Cli(const std::string& args, std::string* out) {
  return testing::RunCommand(std::string(ATTENTION_CLIENT_BINARY) + " " + args, out);
}

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
  EXPECT_EQ(Cli("load --sessions=4 --context=4 --steps=3" + at, &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("2 of 4 sessions failed to be created or prefilled"));
  EXPECT_THAT(out, HasSubstr("decode load: 2 sessions stepping 3 tokens each"));
  EXPECT_THAT(out, HasSubstr("decoded 6/6 tokens")) << out;
  EXPECT_THAT(out, HasSubstr("decode load: 2 sessions x 3 steps after a 4-token context"));
  EXPECT_THAT(out, HasSubstr("2 of 4 sessions failed to start"));

  EXPECT_EQ(Cli("load --sessions=2 --context=20 --steps=3" + at, &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("2 of 2 sessions failed to be created or prefilled; first error:"));
  EXPECT_THAT(out, HasSubstr("no session is ready, so no step ran")) << out;
  EXPECT_THAT(out, Not(HasSubstr("stepping"))) << out;
  EXPECT_THAT(out, Not(HasSubstr("tokens/s"))) << out;
  EXPECT_EQ(server.Stop(), 0);
}

// infer's error names the model the user asked for, not the RPC it called.
TEST(ClientCliInferTest, ModelErrorNamesTheModel) {
  std::string out;
  EXPECT_EQ(Cli("infer --model=demo --deadline_ms=3000 --server=127.0.0.1:1", &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("attention-client: infer: cannot read model 'demo': UNAVAILABLE"));
  EXPECT_THAT(out, Not(HasSubstr("GetModel failed"))) << out;
  EXPECT_EQ(Cli("infer --deadline_ms=3000 --server=127.0.0.1:1", &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("infer: cannot read the server's default model: UNAVAILABLE"));
}

}  // namespace
}  // namespace attention
