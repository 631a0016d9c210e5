// attention-server as a process: start it on free ports, load it from
// several threads, send SIGTERM in the middle, and check that every request
// it accepted got a full, correct response and that it exits 0; SIGTERM
// while models load (at start, and LoadModel calls queued) stops it promptly;
// a busy port and a negative metrics port at start-up.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "attention/v1/attention.grpc.pb.h"
#include "core/mha_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/server_child.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ServerProcessTest, SigtermDrainsAcceptedRequestsAndExitsZero) {
  testing::ServerProcess server(ATTENTION_SERVER_BINARY, {"--drain_timeout_s=20"});
  ASSERT_TRUE(server.ok()) << "server did not become ready";
  auto channel = grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials());

  auto engine = *MhaEngine::Create(MhaModel::Demo());  // Same weights as the server's demo.
  constexpr int kThreads = 4;
  std::atomic<int> ok{0}, refused{0}, wrong{0}, unexpected{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  for (int t = 0; t < kThreads; ++t) {
    clients.emplace_back([&, t] {
      auto stub = v1::AttentionService::NewStub(channel);
      std::mt19937 rng(t);
      for (int i = 0; i < 400 && !stop.load(); ++i) {
        Tensor q = testing::RandomTensor({1, 8 + (i * 5 + t) % 40, 256}, rng);
        v1::InferRequest request;
        testing::ToProto(q, request.mutable_query());
        request.set_is_causal(i % 2 == 0);
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
        v1::InferResponse response;
        const grpc::Status status = stub->Infer(&ctx, request, &response);
        if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
          ++refused;  // Refused while draining, or the server is gone.
          if (refused.load() > 20) stop = true;
          continue;
        }
        if (!status.ok()) {
          ++unexpected;
          ADD_FAILURE() << "accepted request failed: " << status.error_code() << " "
                        << status.error_message();
          continue;
        }
        MhaInputs in;
        in.query = q.view();
        in.is_causal = request.is_causal();
        MhaOutputs expected = *engine->Forward(in);
        Tensor got = testing::FromProto(response.output());
        bool same = got.shape() == expected.output.shape();
        for (int64_t j = 0; same && j < got.num_elements(); ++j) {
          same = std::abs(got.as<float>()[j] - expected.output.as<float>()[j]) <= 1e-5;
        }
        same ? ++ok : ++wrong;
      }
    });
  }
  // SIGTERM once some requests have been answered.
  for (int i = 0; i < 3000 && ok.load() < 40; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  server.Terminate();
  for (auto& c : clients) c.join();
  EXPECT_EQ(server.Wait(), 0);
  EXPECT_GE(ok.load(), 40);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_GT(refused.load(), 0) << "the clients never saw the server stop";
}

// A second server on a busy port says so in one line naming the flag, before
// it starts anything or announces its metrics URL, and exits non-zero.
TEST(ServerProcessTest, ABusyPortIsOneLineBeforeAnythingStarts) {
  testing::ServerProcess first(ATTENTION_SERVER_BINARY, {});
  ASSERT_TRUE(first.ok());
  const std::string command = std::string(ATTENTION_SERVER_BINARY) + " --host=" + first.host() +
                              " --port=" + std::to_string(first.port()) +
                              " --metrics_port=" + std::to_string(testing::FreePort()) +
                              " --http_port=0 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  const int status = pclose(pipe);
  EXPECT_NE(status, 0);
  const std::vector<std::string> lines = absl::StrSplit(output, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u) << output;
  EXPECT_THAT(lines[0], HasSubstr("--port " + std::to_string(first.port()) + ": cannot listen on"));
  EXPECT_THAT(output, Not(HasSubstr("metrics on")));
}

// A negative --metrics_port turns metrics off as 0 does: main probes only a
// port > 0, as AttentionServer::Listen serves metrics only on one (probing
// "-1" once ended start-up with a line blaming the host: "--host 127.0.0.1:
// cannot resolve it (Servname not supported for ai_socktype)").
TEST(ServerProcessTest, ANegativeMetricsPortStillTurnsMetricsOff) {
  testing::ServerProcess server(ATTENTION_SERVER_BINARY, {"--metrics_port=-1"});
  EXPECT_TRUE(server.ok()) << "the server did not come up with --metrics_port=-1";
}

// attention-server started with `args` and `env`, its stderr in a file; it
// is not waited for (ServerProcess waits for SERVING).
class LoggedServer {
 public:
  LoggedServer(const std::vector<std::string>& extra_args, const std::vector<std::string>& env)
      : log_(::testing::TempDir() + "/server_process_" + std::to_string(getpid()) + "_" +
             std::to_string(++count_) + ".log"),
        port_(testing::FreePort()) {
    pid_ = testing::SpawnServer(ATTENTION_SERVER_BINARY, port_, extra_args, log_, env);
  }
  ~LoggedServer() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // Waits (bounded, 30 s) until the log says `text`.
  bool WaitForLog(const std::string& text) const {
    for (int i = 0; i < 3000; ++i) {
      if (Log().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  void Terminate() { kill(pid_, SIGTERM); }
  // Waits (bounded, 30 s) for the exit; its code, or -1 (killed by a
  // signal, or still running: then killed).
  int WaitExit() {
    int status = 0;
    for (int i = 0; i < 3000; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  static inline int count_ = 0;
  const std::string log_;
  const int port_;
  int pid_ = -1;
};

// A stop signal while the models load at start is acted on at once: the
// load is abandoned (the test hook makes it last a minute), the server never
// reports ready, and it exits 0 (a stop that was asked for).
TEST(ServerProcessTest, SigtermDuringTheInitialLoadStopsIt) {
  LoggedServer server({}, {"ATTENTION_TEST_LOAD_DELAY_MS=60000"});
  ASSERT_TRUE(server.WaitForLog("loading models from")) << server.Log();
  server.Terminate();
  EXPECT_EQ(server.WaitExit(), 0) << server.Log();
  const std::string log = server.Log();
  EXPECT_THAT(log, HasSubstr("abandoned"));
  EXPECT_THAT(log, Not(HasSubstr("ready: serving")));
}

// SIGTERM with LoadModel calls queued (and one loading): the queued ones are
// answered UNAVAILABLE at once, the one loading is abandoned at the drain
// deadline (--drain_timeout_s=1), and the server exits 0.
TEST(ServerProcessTest, SigtermCancelsQueuedLoadsAndAbandonsTheOneLoading) {
  const std::string repo =
      ::testing::TempDir() + "/server_process_loads_" + std::to_string(getpid());
  std::filesystem::remove_all(repo);
  auto model = *MhaModel::Random(testing::SelfAttentionSpec(32, 4), 7);
  testing::WriteModelDir(*model, repo + "/m");
  LoggedServer server(
      {"--model_repository=" + repo, "--model_control=explicit", "--drain_timeout_s=1"},
      {"ATTENTION_TEST_LOAD_DELAY_MS=60000:slow"});
  ASSERT_TRUE(server.WaitForLog("ready: serving")) << server.Log();
  testing::WriteModelDir(*model, repo + "/slow");  // Loaded on request only: slowly.
  auto stub = v1::AttentionService::NewStub(
      grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
  constexpr int kLoads = 4;
  struct Call {
    grpc::ClientContext context;
    v1::LoadModelRequest request;
    v1::LoadModelResponse response;
  };
  std::vector<std::unique_ptr<Call>> calls;
  absl::Mutex mu;
  std::vector<grpc::Status> answers;  // Guarded by mu.
  for (int i = 0; i < kLoads; ++i) {
    calls.push_back(std::make_unique<Call>());
    Call* c = calls.back().get();
    c->request.set_name("slow");
    c->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stub->async()->LoadModel(&c->context, &c->request, &c->response, [&](grpc::Status s) {
      absl::MutexLock lock(&mu);
      answers.push_back(s);
    });
  }
  ASSERT_TRUE(server.WaitForLog("test hook: slowing the load of model 'slow'")) << server.Log();
  server.Terminate();
  EXPECT_EQ(server.WaitExit(), 0) << server.Log();
  absl::MutexLock lock(&mu);
  auto all_answered = [&] { return answers.size() == kLoads; };
  mu.AwaitWithTimeout(absl::Condition(&all_answered), absl::Seconds(30));
  ASSERT_EQ(answers.size(), kLoads);
  for (const grpc::Status& s : answers) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }
  EXPECT_THAT(server.Log(), HasSubstr("abandoned"));
  std::filesystem::remove_all(repo);
}

}  // namespace
}  // namespace attention
