// attention-server as a process: start it on free ports, load it from
// several threads, send SIGTERM in the middle, and check that every request
// it accepted got a full, correct response and that it exits 0.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <thread>

#include "absl/strings/str_split.h"
#include "attention/v1/attention.grpc.pb.h"
#include "core/mha_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server_test_util.h"
#include "tests/test_util.h"

namespace attention {
namespace {

using ::attention::testing::FromProto;
using ::attention::testing::ToProto;
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

}  // namespace
}  // namespace attention
