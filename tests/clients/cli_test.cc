// attention-client's subcommands against a live attention-server on free
// loopback ports: infer from .npy files (checked against the engine), random
// inputs, models, health, load with --json, a file of the wrong shape, a
// missing file, and an unreachable server (a clear error within the deadline);
// and errors that say what to do: malformed --server values, a stray
// argument, --version, messages over either side's size limit, and TLS
// mistakes against TLS and mutual-TLS servers (certificates made with openssl).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include "client/cli/npy.h"
#include "core/mha_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/clients/cli_test_util.h"
#include "tests/fixture/server_child.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_certificates.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::testing::HasSubstr;
using testing::RunClient;

class ClientCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new testing::ServerProcess(ATTENTION_SERVER_BINARY, {});
    dir_ = new std::string(::testing::TempDir() + "/client_cli_test_" + std::to_string(getpid()));
    std::filesystem::create_directories(*dir_);
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0);
    delete server_;
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override { ASSERT_TRUE(server_->ok()); }

  // Runs attention-client with `args` against the server.
  int Client(const std::string& args, std::string* output) {
    return testing::RunCommand(
        std::string(ATTENTION_CLIENT_BINARY) + " " + args + " --server=" + server_->target(),
        output);
  }
  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }

  static testing::ServerProcess* server_;
  static std::string* dir_;
};

testing::ServerProcess* ClientCliTest::server_ = nullptr;
std::string* ClientCliTest::dir_ = nullptr;

// The session subcommand checks itself against a stateless Infer and the
// decode load reports its numbers; both exit 0 only without a mismatch.
TEST_F(ClientCliTest, SessionMatchesInferAndDecodeLoadRuns) {
  std::string out;
  ASSERT_EQ(Client("session --tokens=40 --chunk=3", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("40 tokens in 14 appends of up to 3"));
  EXPECT_THAT(out, HasSubstr(": MATCH"));
  ASSERT_EQ(Client("load --sessions=4 --context=20 --steps=5 --json=" + Path("decode.json"), &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("4 sessions x 5 steps after a 20-token context"));
  std::ifstream f(Path("decode.json"));
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(j["errors"].get<int>(), 0);
}

TEST_F(ClientCliTest, InferFromNpyFilesMatchesTheEngine) {
  std::mt19937 rng(3);
  Tensor q = testing::RandomTensor({2, 5, 256}, rng);
  Tensor kpm = testing::RandomMask({2, 5}, rng, 0.3);
  ASSERT_TRUE(client::WriteNpy(Path("q.npy"), q).ok());
  ASSERT_TRUE(client::WriteNpy(Path("kpm.npy"), kpm).ok());
  std::string out;
  ASSERT_EQ(Client("infer --query=" + Path("q.npy") + " --key_padding_mask=" + Path("kpm.npy") +
                       " --is_causal --per_head_weights --output=" + Path("out.npy") +
                       " --weights_output=" + Path("w.npy"),
                   &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("output      [2, 5, 256] float32"));
  EXPECT_THAT(out, HasSubstr("attn_weights [2, 8, 5, 5]"));
  EXPECT_THAT(out, HasSubstr("round trip"));
  auto got = client::ReadNpy(Path("out.npy"));
  auto weights = client::ReadNpy(Path("w.npy"));
  ASSERT_TRUE(got.ok() && weights.ok());
  MhaInputs in;
  in.query = q.view();
  in.key_padding_mask = kpm.view();
  in.is_causal = true;
  in.need_weights = true;
  in.average_attn_weights = false;
  auto expected = (*MhaEngine::Create(MhaModel::Demo()))->Forward(in);
  ASSERT_TRUE(expected.ok());
  ASSERT_EQ(got->shape(), expected->output.shape());
  EXPECT_LE(testing::MaxExcess(
                got->as<float>(),
                std::vector<double>(expected->output.as<float>(),
                                    expected->output.as<float>() + expected->output.num_elements()),
                1e-5),
            1e-6);
  EXPECT_EQ(weights->shape(), (Shape{2, 8, 5, 5}));
}

TEST_F(ClientCliTest, InferWithRandomInputsModelsAndHealth) {
  std::string out;
  ASSERT_EQ(Client("infer --batch=3 --seq_len=7 --output_dtype=bfloat16", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("output      [3, 7, 256] bfloat16"));
  EXPECT_THAT(out, HasSubstr("batch of 1 request(s)"));
  ASSERT_EQ(Client("models", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("demo *"));
  EXPECT_THAT(out, HasSubstr("256"));
  ASSERT_EQ(Client("health", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("SERVING"));
}

TEST_F(ClientCliTest, LoadWritesItsTable) {
  std::string out;
  ASSERT_EQ(Client("load --concurrency=1,4 --requests=40 --seq_len=4:32 --pad_share=0.25 --json=" +
                       Path("load.json") + " --csv=" + Path("load.csv"),
                   &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("p99_ms"));
  std::ifstream in(Path("load.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["concurrency"], 1);
  EXPECT_EQ(j[1]["concurrency"], 4);
  EXPECT_EQ(j[1]["requests"], 40);
  EXPECT_TRUE(j[1]["errors"].empty());
  EXPECT_GT(j[1]["requests_per_s"].get<double>(), 0);
  EXPECT_GE(j[1]["p99_ms"].get<double>(), j[1]["p50_ms"].get<double>());
  ASSERT_EQ(Client("load --concurrency=2 --requests=10 --rpc=stream", &out), 0) << out;
}

// Against a server whose connections live 0.2 s + 0.1 s (GOAWAY, then closed
// under the calls still open): the stream load's streams are cut several
// times in 2 s, reopened and their requests re-sent, without an error; the
// decode load's appends (with expected_length, re-sent if cut) run without
// one either.
TEST(ClientCliConnectionAgeTest, LoadsRunThroughConnectionsClosedUnderThem) {
  testing::ServerProcess server(ATTENTION_SERVER_BINARY,
                                {"--max_connection_age_s=0.2", "--max_connection_age_grace_s=0.1"});
  ASSERT_TRUE(server.ok());
  const std::string json =
      ::testing::TempDir() + "/client_cli_age_" + std::to_string(getpid()) + ".json";
  std::string out;
  ASSERT_EQ(testing::RunCommand(std::string(ATTENTION_CLIENT_BINARY) +
                                    " load --rpc=stream --concurrency=2 --duration=2s --seq_len=4"
                                    " --json=" +
                                    json + " --server=" + server.target(),
                                &out),
            0)
      << out;
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_TRUE(j[0]["errors"].empty()) << j.dump();
  EXPECT_GT(j[0]["reopens"].get<int>(), 0);  // The streams were cut, and reopened.
  EXPECT_GT(j[0]["requests"].get<int>(), 0);
  ASSERT_EQ(testing::RunCommand(
                std::string(ATTENTION_CLIENT_BINARY) +
                    " load --sessions=2 --context=16 --steps=40 --server=" + server.target(),
                &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("errors 0"));
  std::filesystem::remove(json);
  EXPECT_EQ(server.Stop(), 0);
}

TEST_F(ClientCliTest, WrongShapeFileIsAClearError) {
  std::mt19937 rng(4);
  ASSERT_TRUE(client::WriteNpy(Path("bad.npy"), testing::RandomTensor({1, 4, 100}, rng)).ok());
  std::string out;
  EXPECT_NE(Client("infer --query=" + Path("bad.npy"), &out), 0);
  EXPECT_THAT(out, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(out, HasSubstr("query: expected shape [*, *, 256], got [1, 4, 100]"));
  EXPECT_NE(Client("infer --query=" + Path("missing.npy"), &out), 0);
  EXPECT_THAT(out, HasSubstr("cannot open"));
  EXPECT_NE(Client("frobnicate", &out), 0);
  EXPECT_THAT(out, HasSubstr("unknown subcommand"));
}

TEST_F(ClientCliTest, EmptyTensorFilesAreSentForTheServerToJudge) {
  // A given file is sent even when it holds no elements: it used to be
  // dropped, turning a (1, 0, 256) key into self-attention that exits 0.
  std::mt19937 rng(5);
  ASSERT_TRUE(client::WriteNpy(Path("q4.npy"), testing::RandomTensor({1, 4, 256}, rng)).ok());
  ASSERT_TRUE(client::WriteNpy(Path("empty_key.npy"), Tensor(DType::kFloat32, {1, 0, 256})).ok());
  ASSERT_TRUE(client::WriteNpy(Path("empty_kpm.npy"), Tensor(DType::kBool, {1, 0})).ok());
  std::string out;
  EXPECT_NE(Client("infer --query=" + Path("q4.npy") + " --key=" + Path("empty_key.npy"), &out), 0);
  EXPECT_THAT(out, HasSubstr("INVALID_ARGUMENT: key: every dimension must be in [1, 2^31]"));
  EXPECT_NE(
      Client("infer --query=" + Path("q4.npy") + " --key_padding_mask=" + Path("empty_kpm.npy"),
             &out),
      0);
  EXPECT_THAT(out, HasSubstr("INVALID_ARGUMENT: key_padding_mask: every dimension"));
}

TEST(ClientCliUnreachableTest, FailsClearlyWithinTheDeadline) {
  const int port = testing::FreePort();  // Nothing listens there.
  for (const char* command : {"health", "infer --seq_len=4", "models"}) {
    std::string out;
    const auto start = std::chrono::steady_clock::now();
    const int code =
        testing::RunCommand(std::string(ATTENTION_CLIENT_BINARY) + " " + command +
                                " --deadline_ms=1500 --server=127.0.0.1:" + std::to_string(port),
                            &out);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(code, 0) << command;
    EXPECT_THAT(out, ::testing::AnyOf(HasSubstr("UNAVAILABLE"), HasSubstr("DEADLINE_EXCEEDED")))
        << out;
    EXPECT_LT(seconds, 5.0) << command;
  }
}

TEST(ClientCliErrorsTest, MalformedServerStrayArgumentsAndVersion) {
  std::string out;
  EXPECT_EQ(RunClient("health --server=http://localhost:50651", &out), 2);
  EXPECT_THAT(out, HasSubstr("--server 'http://localhost:50651': a URL; a gRPC target is "
                             "host:port: use --server localhost:50651"));
  EXPECT_EQ(RunClient("models --server=https://attention.example.com", &out), 2);
  EXPECT_THAT(out, HasSubstr("use --server attention.example.com:50051 --tls"));
  EXPECT_EQ(RunClient("infer --server=localhost", &out), 2);
  EXPECT_THAT(out, HasSubstr("--server 'localhost': no port (gRPC would use 443): give "
                             "host:port, e.g. 'localhost:50051'"));
  EXPECT_EQ(RunClient("health extra --server=localhost:1", &out), 2);
  EXPECT_THAT(out, HasSubstr("unexpected argument 'extra'"));
  EXPECT_EQ(RunClient("--version", &out), 0);
  EXPECT_THAT(out, ::testing::MatchesRegex("attention-client [0-9]+\\.[0-9]+\\.[0-9]+\n"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("Debug build")));
}

TEST(ClientCliErrorsTest, MessagesOverALimitNameMaxMessageBytes) {
  // The server's limit: a 2 MiB request to a server that takes 1 MiB.
  testing::ServerProcess small(ATTENTION_SERVER_BINARY, {"--max_message_bytes=1048576"});
  ASSERT_TRUE(small.ok());
  std::string out;
  EXPECT_EQ(RunClient("infer --seq_len=2048 --server=" + small.target(), &out), 1);
  EXPECT_THAT(out, HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_THAT(out, ::testing::ContainsRegex(
                       "hint: the request is [0-9]+ bytes, over the server's limit of 1048576: "
                       "send less per request, or start the server with "
                       "--max_message_bytes=[0-9]+ or more"));
  // The client's own limit.
  EXPECT_EQ(RunClient("infer --seq_len=2048 --max_message_bytes=1048576 --server=" + small.target(),
                      &out),
            1);
  EXPECT_THAT(out, HasSubstr("over this client's limit of 1048576: raise --max_message_bytes"));
  EXPECT_EQ(small.Stop(), 0);
}

// attention-server with TLS flags as a child process (ServerProcess checks
// readiness in plaintext); ready once `attention-client health` with
// `client_flags` says SERVING (bounded, 30 s).
class TlsServer {
 public:
  TlsServer(const std::vector<std::string>& flags, const std::string& client_flags) {
    port_ = testing::FreePort();
    pid_ = testing::SpawnServer(ATTENTION_SERVER_BINARY, port_, flags);
    std::string out;
    for (int i = 0; i < 300 && !ready_; ++i) {
      ready_ = RunClient("health --deadline_ms=500 --server=" + target() + " " + client_flags,
                         &out) == 0;
      if (!ready_) usleep(100 * 1000);
    }
  }
  ~TlsServer() {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  bool ok() const { return ready_; }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int pid_ = -1;
  int port_ = 0;
  bool ready_ = false;
};

TEST_F(ClientCliTest, TlsMistakesSayWhatToDo) {
  testing::TestCertificates certs(Path("certs"));
  ASSERT_TRUE(certs.ok()) << certs.error();
  const std::string ca1 = " --tls_ca_file=" + certs.Path("ca1.pem");
  const std::string client_cert = " --tls_cert_file=" + certs.Path("client-ca1.pem") +
                                  " --tls_key_file=" + certs.Path("client-ca1.key");
  TlsServer tls({"--tls_cert_file=" + certs.Path("server-ca1.pem"),
                 "--tls_key_file=" + certs.Path("server-ca1.key")},
                ca1);
  TlsServer mtls({"--tls_cert_file=" + certs.Path("server-ca1.pem"),
                  "--tls_key_file=" + certs.Path("server-ca1.key"),
                  "--tls_client_ca_file=" + certs.Path("ca1.pem")},
                 ca1 + client_cert);
  ASSERT_TRUE(tls.ok() && mtls.ok());
  std::string out;
  // gRPC's raw log lines ("E1129 04:55:37.144318628 16142
  // ssl_transport_security.cc:1501] Handshake failed ...") stay out: the
  // client's own error names the cause.
  const auto raw = ::testing::Not(::testing::ContainsRegex("(^|\n)[EWI][0-9]{4} [0-9:.]+ "));
  const std::string health = "health --deadline_ms=3000 --server=";
  EXPECT_EQ(RunClient(health + tls.target(), &out), 1);
  EXPECT_THAT(out, HasSubstr("hint: the server speaks TLS: pass --tls")) << out;
  EXPECT_THAT(out, raw);
  EXPECT_EQ(RunClient(health + server_->target() + ca1, &out), 1);
  EXPECT_THAT(out, HasSubstr("hint: the server speaks plaintext, not TLS")) << out;
  EXPECT_THAT(out, raw);
  EXPECT_EQ(RunClient(health + mtls.target() + ca1, &out), 1);
  EXPECT_THAT(out, HasSubstr("pass --tls_cert_file and --tls_key_file")) << out;
  EXPECT_THAT(out, raw);
  EXPECT_EQ(RunClient(health + mtls.target() + " --tls_ca_file=" + certs.Path("ca1.pem") +
                          " --tls_cert_file=" + certs.Path("client-ca2.pem") +
                          " --tls_key_file=" + certs.Path("client-ca2.key"),
                      &out),
            1);
  EXPECT_THAT(out, HasSubstr("the server did not accept the client certificate")) << out;
  EXPECT_THAT(out, raw);
  EXPECT_EQ(RunClient(health + tls.target() + " --tls_ca_file=" + certs.Path("ca2.pem"), &out), 1);
  EXPECT_THAT(out, HasSubstr("hint: the client does not trust the server's certificate")) << out;
  EXPECT_THAT(out, raw);
  // Right flags: no hint, SERVING.
  EXPECT_EQ(RunClient(health + mtls.target() + ca1 + client_cert, &out), 0) << out;
  EXPECT_THAT(out, ::testing::Not(HasSubstr("hint")));
}

}  // namespace
}  // namespace attention
