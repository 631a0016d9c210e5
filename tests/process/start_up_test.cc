// attention-server's start-up as a process (issue 38): --exit_on_error
// stops the start-up on a bad model folder and names it (without it the
// server serves the good models: model_lifecycle_bad_folder_test); --help
// exits 0; a numeric flag out of range is refused naming it and its value;
// scripts/make_dev_certs.sh writes keys 0600; gRPC's raw "Handshake failed"
// lines become one line of the server's own.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "attention/v1/attention.grpc.pb.h"

#include "core/mha_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/server_child.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_certificates.h"
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
// exit, killed after 20 s (a server that should have refused to start).
Ran RunServer(const std::string& args) {
  const std::string command = "timeout -s KILL 20 " + std::string(ATTENTION_SERVER_BINARY) +
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

TEST(StartUpTest, HelpExitsZero) {
  const Ran ran = RunServer("--help");
  EXPECT_EQ(ran.exit_code, 0);
  EXPECT_THAT(ran.output, HasSubstr("--threads"));
  EXPECT_THAT(ran.output, HasSubstr("--exit_on_error"));
  // The headline names every port with its flag.
  EXPECT_THAT(ran.output, HasSubstr("gRPC on 50051 (--port), KServe v2 REST on 8000 "
                                    "(--http_port), Prometheus /metrics on 9464 (--metrics_port)"));
}

TEST(StartUpTest, NumericFlagsOutOfRangeAreRefusedNamingFlagAndValue) {
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--threads=-1", "--threads=-1: expected 0 to 4096"},
           {"--max_batch_size=0", "--max_batch_size=0: expected >= 1"},
           {"--infer_parse_threads=100", "--infer_parse_threads=100: expected 1 to 64"},
           {"--max_inflight_bytes=-5", "--max_inflight_bytes=-5: expected >= 0"}}) {
    const Ran ran = RunServer(args);
    EXPECT_NE(ran.exit_code, 0) << args;
    const std::vector<std::string> lines = absl::StrSplit(ran.output, '\n', absl::SkipEmpty());
    ASSERT_EQ(lines.size(), 1u) << ran.output;  // Refused first, in one line.
    EXPECT_THAT(lines[0], HasSubstr(says));
  }
}

TEST(StartUpTest, MakeDevCertsWritesPrivateKeysOwnerOnly) {
  const std::string dir = ::testing::TempDir() + "/start_up_certs_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::string out;
  ASSERT_EQ(testing::RunCommand(
                std::string(ATTENTION_SOURCE_DIR) + "/scripts/make_dev_certs.sh '" + dir + "' 2>&1",
                &out),
            0)
      << out;
  for (const char* key : {"ca.key", "tls.key", "client.key"}) {
    struct stat st {};
    ASSERT_EQ(stat((dir + "/" + key).c_str(), &st), 0) << key;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << key;
  }
  struct stat crt {};
  ASSERT_EQ(stat((dir + "/tls.crt").c_str(), &crt), 0);
  EXPECT_EQ(crt.st_mode & 0777, 0644u);  // Certificates are public.
  std::filesystem::remove_all(dir);
}

// A plaintext client on the TLS port: gRPC 1.51 logs a raw "E1128 ...
// ssl_transport_security.cc:1501] Handshake failed ..." per attempt; the
// server turns them into one line of its own saying what it likely means.
TEST(StartUpTest, HandshakeFailuresAreOneLineOfTheServers) {
  const std::string dir = ::testing::TempDir() + "/start_up_tls_" + std::to_string(getpid());
  testing::TestCertificates certs(dir);
  ASSERT_TRUE(certs.ok()) << certs.error();
  const std::string log = dir + "/server.log";
  const int port = testing::FreePort();
  const pid_t pid =
      testing::SpawnServer(ATTENTION_SERVER_BINARY, port,
                           {"--warmup=false", "--tls_cert_file=" + certs.Path("server-ca1.pem"),
                            "--tls_key_file=" + certs.Path("server-ca1.key")},
                           log);
  ASSERT_GT(pid, 0);
  auto read_log = [&] {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  bool ready = false;
  for (int i = 0; i < 3000 && !ready; ++i) {
    ready = read_log().find("ready: serving") != std::string::npos;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(ready) << read_log();
  auto stub = v1::AttentionService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListModelsResponse response;
    EXPECT_FALSE(stub->ListModels(&context, v1::ListModelsRequest(), &response).ok());
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string text = read_log();
  EXPECT_THAT(text, HasSubstr("TLS: a client's handshake failed (wrong version number: a client "
                              "speaking plaintext to this TLS port?)"));
  EXPECT_THAT(text, Not(HasSubstr("ssl_transport_security.cc")));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace attention
