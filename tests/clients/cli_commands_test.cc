// attention-client against live attention-servers, for what a new user meets
// first (issue 38): model control and versions (models, repository, load
// MODEL, unload MODEL, infer --model_version), errors that name the fix (a
// port where nothing listens, a missing token), progress on stderr while the
// load generator and the decode load run, and --help and out-of-range flags.
// Every assertion is on the text; nothing is timed.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/mha_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/clients/cli_test_util.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using testing::NewDir;
using ::testing::Not;
using testing::RunClient;

// Writes a random 32-wide, 4-head model as `dir`.
void WriteModel(const std::string& dir, uint64_t seed) {
  testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(32, 4), seed), dir);
}

TEST(ClientCliModelControlTest, ModelsRepositoryLoadUnloadAndVersions) {
  const std::string repo = NewDir("client_cli_models");
  WriteModel(repo + "/m/1", 1);
  WriteModel(repo + "/m/2", 2);
  testing::ServerProcess server(ATTENTION_SERVER_BINARY,
                                {"--model_repository=" + repo, "--model_control=explicit"});
  ASSERT_TRUE(server.ok());
  // A model that appears after start: loaded on request only.
  WriteModel(repo + "/late/3", 3);
  const std::string at = " --server=" + server.target();
  std::string out;
  ASSERT_EQ(RunClient("models" + at, &out), 0) << out;
  EXPECT_THAT(out, ContainsRegex("name +version +embed"));
  EXPECT_THAT(out, ContainsRegex("\nm \\* +2 +32 .*\\| 2:READY"));

  ASSERT_EQ(RunClient("repository" + at, &out), 0) << out;
  EXPECT_THAT(out, ContainsRegex("name +version +state +reason"));
  EXPECT_THAT(out, ContainsRegex("\nm +2 +READY"));

  ASSERT_EQ(RunClient("load late" + at, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("loaded model 'late': version(s) 3 serving"));
  ASSERT_EQ(RunClient("models" + at, &out), 0) << out;
  EXPECT_THAT(out, ContainsRegex("\nlate +3 +32 .*\\| 3:READY"));
  ASSERT_EQ(RunClient("infer --model=late --model_version=3 --seq_len=2" + at, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("model       version 3"));

  ASSERT_EQ(RunClient("unload late" + at, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("unloaded model 'late'"));
  ASSERT_EQ(RunClient("models" + at, &out), 0) << out;
  EXPECT_THAT(out, Not(HasSubstr("\nlate ")));
  ASSERT_EQ(RunClient("repository" + at, &out), 0) << out;
  EXPECT_THAT(out, ContainsRegex("\nlate +- +UNAVAILABLE +unloaded"));
  EXPECT_NE(RunClient("unload" + at, &out), 0);
  EXPECT_THAT(out, HasSubstr("unload: which model?"));
  EXPECT_EQ(server.Stop(), 0);
  std::filesystem::remove_all(repo);
}

// A port where nothing listens: one line naming the target once, and the
// hint; a server that wants a token: the hint names --token_file and
// ATTENTION_TOKEN.
TEST(ClientCliErrorHintsTest, NothingListeningAndMissingToken) {
  const std::string port = std::to_string(testing::FreePort());
  std::string out;
  for (const char* command : {"infer --seq_len=4", "models", "load --sessions=1"}) {
    EXPECT_EQ(RunClient(std::string(command) + " --server=127.0.0.1:" + port, &out), 1) << command;
    EXPECT_THAT(out, ContainsRegex("(cannot read the server's default model|ListModels failed): "
                                   "UNAVAILABLE: cannot connect to "
                                   "127.0.0.1:" +
                                   port +
                                   " \\(connection refused\\)\n  hint: nothing is listening "
                                   "at 127.0.0.1:" +
                                   port + "\\? start attention-server there"))
        << out;
    EXPECT_THAT(out, HasSubstr("pass --server HOST:PORT")) << out;
    EXPECT_THAT(out, Not(HasSubstr("GetModel: UNAVAILABLE"))) << out;
  }

  const std::string dir = NewDir("client_cli_token");
  // A token file's entry: the token's SHA-256 in hex, a name, the models.
  ASSERT_EQ(testing::RunCommand(
                "printf s3cret | sha256sum | sed 's/ .*/ alice */' > " + dir + "/tokens", &out),
            0)
      << out;
  std::ofstream(dir + "/token") << "s3cret\n";
  std::ofstream(dir + "/wrong") << "guess\n";
  testing::ServerProcess server(ATTENTION_SERVER_BINARY, {"--auth_tokens_file=" + dir + "/tokens"});
  ASSERT_TRUE(server.ok());
  const std::string at = " --server=" + server.target();
  EXPECT_EQ(
      testing::RunCommand(
          "env -u ATTENTION_TOKEN " + std::string(ATTENTION_CLIENT_BINARY) + " models" + at, &out),
      1);
  EXPECT_THAT(out, HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(out, HasSubstr("hint: the server wants a bearer token: pass --token_file=FILE"));
  EXPECT_THAT(out, HasSubstr("ATTENTION_TOKEN"));
  EXPECT_EQ(RunClient("models --token_file=" + dir + "/wrong" + at, &out), 1);
  EXPECT_THAT(out, HasSubstr("hint: the server refused this client's bearer token"));
  EXPECT_EQ(RunClient("models --token_file=" + dir + "/token" + at, &out), 0) << out;
  EXPECT_EQ(server.Stop(), 0);
  std::filesystem::remove_all(dir);
}

// The load generator prints each level's row as the level ends (before the
// next level starts), and the decode load its prefill and decode progress.
// --tls against a plaintext server: the hint, and none of gRPC's raw
// "E1128 ... ssl_transport_security.cc:1501] Handshake failed ..." lines
// (issue 38, wall 6: they appeared in the client's stderr too; the call's
// own error already carries the SSL reason).
TEST(ClientCliErrorHintsTest, TlsToAPlaintextServerPrintsNoRawGrpcHandshakeLines) {
  testing::ServerProcess server(ATTENTION_SERVER_BINARY, {});
  ASSERT_TRUE(server.ok());
  std::string out;
  EXPECT_NE(RunClient("models --tls --deadline_ms=5000 --server=" + server.target(), &out), 0);
  EXPECT_THAT(out, HasSubstr("leave out --tls"));
  EXPECT_THAT(out, HasSubstr("wrong version number"));  // In the call's own error.
  EXPECT_THAT(out, Not(HasSubstr("ssl_transport_security")));
  EXPECT_THAT(out, Not(HasSubstr("Handshake failed with fatal error")));
  EXPECT_EQ(server.Stop(), 0);
}

TEST(ClientCliProgressTest, LoadLevelsAndDecodeLoadReportAsTheyGo) {
  testing::ServerProcess server(ATTENTION_SERVER_BINARY, {});
  ASSERT_TRUE(server.ok());
  const std::string at = " --server=" + server.target();
  std::string out;
  ASSERT_EQ(RunClient("load --concurrency=1,2 --requests=6 --seq_len=4" + at, &out), 0) << out;
  const size_t first = out.find("load: level 1 of 2: concurrency 1, 6 requests");
  const size_t row1 = out.find("\n1  ");
  const size_t second = out.find("load: level 2 of 2: concurrency 2, 6 requests");
  const size_t row2 = out.find("\n2  ");
  ASSERT_NE(first, std::string::npos) << out;
  ASSERT_NE(second, std::string::npos) << out;
  EXPECT_LT(first, row1) << out;
  EXPECT_LT(row1, second) << out;  // The first row before the second level starts.
  EXPECT_LT(second, row2) << out;

  ASSERT_EQ(RunClient("load --sessions=3 --context=20 --steps=2" + at, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("decode load: creating 3 sessions, each prefilling 20 tokens"));
  EXPECT_THAT(out, HasSubstr("prefilled 3/3 sessions"));
  EXPECT_THAT(out, HasSubstr("decoded 6/6 tokens"));
  EXPECT_EQ(server.Stop(), 0);
}

TEST(ClientCliFlagsTest, HelpExitsZeroAndOutOfRangeNumbersAreRefused) {
  std::string out;
  EXPECT_EQ(RunClient("--help", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("attention-client {infer|models|repository|load|unload"));
  EXPECT_THAT(out, HasSubstr("--deadline_ms"));
  for (const auto& [flag, message] : std::vector<std::pair<std::string, std::string>>{
           {"--batch=-1", "--batch=-1: expected a number >= 1"},
           {"--sessions=-3", "--sessions=-3: expected a number >= 0"},
           {"--requests=-5", "--requests=-5: expected a number >= 0"},
           {"--deadline_ms=0", "--deadline_ms=0: expected a number >= 1"},
           {"--rate=-2", "--rate=-2: expected requests per second >= 0"},
           {"--pad_share=1.5", "--pad_share=1.5: expected a share from 0 to 1"},
           {"--concurrency=0,4", "--concurrency=0,4: expected counts of at least 1"},
           {"--duration=-1s", "--duration=-1s: expected a positive duration"}}) {
    EXPECT_EQ(RunClient("load " + flag + " --server=127.0.0.1:1", &out), 2) << flag;
    EXPECT_THAT(out, HasSubstr(message)) << flag;
  }
  // `load MODEL` beside a load-generator flag: the name is a stray value.
  EXPECT_EQ(RunClient("load --concurrency 1,8 64 --server=127.0.0.1:1", &out), 2);
  EXPECT_THAT(out, HasSubstr("load 64: load MODEL loads a model, but --concurrency is a "
                             "load-generator flag"));
  // The same for the random inputs' flags the load generator shares with
  // infer (--help: "infer/load"): `--batch 4 8` is not LoadModel("8").
  for (const std::string flag : {"--batch 4", "--seq_len 16:64", "--kv_seq_len 32", "--seed 7"}) {
    EXPECT_EQ(RunClient("load " + flag + " 8 --server=127.0.0.1:1", &out), 2)
        << flag << ": " << out;
    EXPECT_THAT(out, HasSubstr("load 8: load MODEL loads a model, but " +
                               flag.substr(0, flag.find(' ')) + " is a load-generator flag"))
        << flag;
  }
}

}  // namespace
}  // namespace attention
