// Scale-out: three attention-server replicas on loopback behind one client
// channel with round_robin load balancing (the same channel attention-client
// uses). Every replica must serve a fair share and no request may be lost;
// then one replica is stopped mid-load (SIGTERM: it drains and reports
// NOT_SERVING) and the client's requests must keep succeeding on the others.
// Sessions: 30 spread over 3 replicas started with --advertise_address; one
// replica dies mid-run; the others' sessions go on untouched and the lost
// ones recover by re-create-and-replay, still equal to the reference.
#include <algorithm>
#include <atomic>
#include <deque>
#include <random>
#include <thread>

#include "absl/strings/str_join.h"
#include "attention/v1/attention.grpc.pb.h"
#include "client/cli/client_util.h"
#include "client/cli/session_client.h"
#include "core/mha_engine.h"
#include "gtest/gtest.h"
#include "proto/codec/tensor_codec.h"
#include "tests/fixture/server_test_util.h"

namespace attention {
namespace {

double OkCount(const testing::ServerProcess& server) {
  const std::string metrics = testing::HttpGet(server.metrics_port(), "/metrics");
  return testing::MetricValue(metrics, "attention_requests_total",
                              {"code=\"OK\"", "method=\"Infer\"", "model=\"demo\""});
}

// Sends `count` requests from `threads` threads; returns the failures.
int SendLoad(v1::AttentionService::Stub* stub, int threads, int count, std::atomic<int>* sent_ok) {
  std::atomic<int> next{0}, failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(t);
      v1::InferRequest request;
      wire::EncodeTensor(client::RandomNormal({1, 16, 256}, rng), request.mutable_query());
      while (next.fetch_add(1) < count) {
        grpc::ClientContext ctx;
        client::SetDeadline(&ctx, 20000);
        v1::InferResponse response;
        const grpc::Status status = stub->Infer(&ctx, request, &response);
        if (status.ok() && response.output().shape_size() == 3) {
          ++*sent_ok;
        } else {
          ++failures;
          ADD_FAILURE() << "request failed: " << status.error_code() << " "
                        << status.error_message();
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  return failures.load();
}

TEST(ScaleOutTest, RoundRobinSharesLoadAndSurvivesAReplicaStopping) {
  std::vector<std::unique_ptr<testing::ServerProcess>> replicas;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    replicas.push_back(std::make_unique<testing::ServerProcess>(
        ATTENTION_SERVER_BINARY, std::vector<std::string>{"--threads=1"}));
    ASSERT_TRUE(replicas.back()->ok()) << "replica " << i << " did not start";
    addresses.push_back(replicas.back()->target());
  }
  auto channel = client::MakeChannel("ipv4:" + absl::StrJoin(addresses, ","), "round_robin");
  auto stub = v1::AttentionService::NewStub(channel);

  // Phase 1: a fair share each, nothing lost.
  constexpr int kRequests = 300;
  std::atomic<int> ok{0};
  ASSERT_EQ(SendLoad(stub.get(), 6, kRequests, &ok), 0);
  EXPECT_EQ(ok.load(), kRequests);
  double total = 0;
  for (const auto& r : replicas) {
    const double served = OkCount(*r);
    total += served;
    EXPECT_GE(served, 0.2 * kRequests) << "replica " << r->target() << " served too few";
  }
  EXPECT_EQ(total, kRequests) << "every request counted exactly once across replicas";

  // Phase 2: stop replica 0 while load runs; every request must still succeed.
  const double survivors_before = OkCount(*replicas[1]) + OkCount(*replicas[2]);
  std::atomic<int> ok2{0};
  int failures = 0;
  std::thread load([&] { failures = SendLoad(stub.get(), 6, 600, &ok2); });
  while (ok2.load() < 100) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(replicas[0]->Stop(), 0) << "a stopped replica drains and exits 0";
  load.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(ok2.load(), 600);
  // Replica 0 served at most its share of the first 100-odd; the rest went
  // to the survivors.
  EXPECT_GE(OkCount(*replicas[1]) + OkCount(*replicas[2]) - survivors_before, 450);
}

TEST(ScaleOutTest, SessionsLiveOnTheirReplicaAndRecoverByReplay) {
  std::vector<std::unique_ptr<testing::ServerProcess>> replicas;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    const int port = testing::FreePort();
    const std::string address = "127.0.0.1:" + std::to_string(port);
    replicas.push_back(std::make_unique<testing::ServerProcess>(
        ATTENTION_SERVER_BINARY,
        std::vector<std::string>{"--threads=1", "--advertise_address=" + address}, "127.0.0.1",
        port));
    ASSERT_TRUE(replicas.back()->ok()) << "replica " << i << " did not start";
    addresses.push_back(address);
  }
  client::SessionClient sessions("ipv4:" + absl::StrJoin(addresses, ","), "round_robin", 10000);
  // The reference: the demo model (every replica serves it) run stateless
  // with is_causal over each whole sequence.
  auto engine = *MhaEngine::Create(MhaModel::Demo());
  constexpr int kSessions = 30;
  constexpr int64_t kTokens = 12, kE = 256;
  std::mt19937 rng(21);
  std::vector<Tensor> xs;
  std::deque<client::ReplayingSession> live;  // Not movable.
  std::vector<std::vector<float>> outputs(kSessions);
  for (int s = 0; s < kSessions; ++s) {
    xs.push_back(client::RandomNormal({kTokens, kE}, rng));
    live.emplace_back(&sessions, "");
  }
  auto step = [&](int s, int64_t i) {
    const Tensor token = Tensor::FromBytes(DType::kFloat32, {1, kE}, xs[s].as<float>() + i * kE);
    auto out = live[s].Append(token);
    ASSERT_TRUE(out.ok()) << "session " << s << " token " << i << ": " << out.status();
    outputs[s].insert(outputs[s].end(), out->as<float>(), out->as<float>() + kE);
  };
  for (int64_t i = 0; i < kTokens / 2; ++i) {
    for (int s = 0; s < kSessions; ++s) step(s, i);
  }
  // Every replica holds some sessions, and each id names its replica.
  std::vector<int> on(3, 0);
  for (const auto& session : live) {
    const std::string& id = session.session_id();
    const std::string address = id.substr(id.find('@') + 1);
    const auto it = std::find(addresses.begin(), addresses.end(), address);
    ASSERT_NE(it, addresses.end()) << id;
    ++on[it - addresses.begin()];
  }
  for (int r = 0; r < 3; ++r) EXPECT_GE(on[r], 5) << "replica " << r;
  replicas[1]->Kill();
  EXPECT_EQ(replicas[1]->Wait(), -1);
  for (int64_t i = kTokens / 2; i < kTokens; ++i) {
    for (int s = 0; s < kSessions; ++s) step(s, i);
  }
  int recovered = 0;
  for (int s = 0; s < kSessions; ++s) {
    const bool was_on_lost =
        live[s].session_id().find(addresses[1]) != std::string::npos || live[s].recoveries() > 0;
    EXPECT_EQ(live[s].recoveries(), was_on_lost ? 1 : 0) << "session " << s;
    recovered += live[s].recoveries();
    MhaInputs in;
    in.query = TensorView{DType::kFloat32, {1, kTokens, kE}, xs[s].data()};
    in.is_causal = true;
    auto want = engine->Forward(in);
    ASSERT_TRUE(want.ok());
    for (int64_t j = 0; j < kTokens * kE; ++j) {
      ASSERT_NEAR(outputs[s][j], want->output.as<float>()[j], 1e-4)
          << "session " << s << " value " << j;
    }
    live[s].Close();
  }
  EXPECT_EQ(recovered, on[1]) << "exactly the lost replica's sessions were re-created";
}

}  // namespace
}  // namespace attention
