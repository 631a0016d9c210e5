// attention-server as a process: start it on free ports, load it from
// several threads, send SIGTERM in the middle, and check that every request
// it accepted got a full, correct response and that it exits 0.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <thread>

#include "attention/v1/attention.grpc.pb.h"
#include "core/mha_engine.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/server_test_util.h"
#include "tests/test_util.h"

namespace attention {
namespace {

using ::attention::testing::FromProto;
using ::attention::testing::ToProto;

pid_t StartServer(int port) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string port_flag = "--port=" + std::to_string(port);
    execl(ATTENTION_SERVER_BINARY, ATTENTION_SERVER_BINARY, "--host=127.0.0.1", port_flag.c_str(),
          "--metrics_port=0", "--drain_timeout_s=20", nullptr);
    _exit(127);
  }
  return pid;
}

bool WaitServing(const std::shared_ptr<grpc::Channel>& channel) {
  auto health = grpc::health::v1::Health::NewStub(channel);
  for (int i = 0; i < 300; ++i) {  // Up to 30 s.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    grpc::health::v1::HealthCheckResponse resp;
    if (health->Check(&ctx, {}, &resp).ok() &&
        resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST(ServerProcessTest, SigtermDrainsAcceptedRequestsAndExitsZero) {
  const int port = testing::FreePort();
  const pid_t pid = StartServer(port);
  ASSERT_GT(pid, 0);
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  ASSERT_TRUE(WaitServing(channel)) << "server did not become ready";

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
        ToProto(q, request.mutable_query());
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
        Tensor got = FromProto(response.output());
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
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  for (auto& c : clients) c.join();
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
  EXPECT_GE(ok.load(), 40);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_GT(refused.load(), 0) << "the clients never saw the server stop";
}

}  // namespace
}  // namespace attention
