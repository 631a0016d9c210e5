// Each gateway (nginx and HAProxy, running the reference configurations in
// deploy/) in front of attention-server replicas: stateless calls without
// the routing header stay round robin; a session call without the header
// says what to add; sessions survive a killed replica and an added one.
#include <grpcpp/grpcpp.h>

#include <deque>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "attention/v1/attention.grpc.pb.h"
#include "client/cli/client_util.h"
#include "client/cli/session_client.h"
#include "core/mha_engine.h"
#include "gtest/gtest.h"
#include "proto/codec/routing_key.h"
#include "proto/codec/tensor_codec.h"
#include "tests/fixture/server_test_util.h"
#include "tests/scale_out/gateway_process.h"
#include "tests/scale_out/gateway_test_util.h"

namespace attention {
namespace {

using testing::GatewayProcess;
using namespace ::attention::gateway_test;  // NOLINT: the shared helpers.

// A gateway kind that is not installed skips the test.
class EachGatewayTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    std::string why;
    if (Skip(GetParam(), &why)) GTEST_SKIP() << why;
  }
};

// No key, no hash: each call goes to the next replica.
TEST_P(EachGatewayTest, StatelessInferStaysRoundRobin) {
  auto replicas = StartReplicas(3);
  GatewayProcess gateway(GetParam(), Targets(replicas, {0, 1, 2}));
  ASSERT_TRUE(gateway.ok()) << gateway.error();
  auto stub = v1::AttentionService::NewStub(client::MakeChannel(gateway.target(), "pick_first"));
  std::mt19937 rng(3);
  v1::InferRequest request;
  wire::EncodeTensor(client::RandomNormal({1, 8, kE}, rng), request.mutable_query());
  constexpr int kCalls = 300;
  for (int i = 0; i < kCalls; ++i) {
    grpc::ClientContext context;
    client::SetDeadline(&context, 20000);
    v1::InferResponse response;
    ASSERT_TRUE(stub->Infer(&context, request, &response).ok());
  }
  double total = 0;
  for (const auto& r : replicas) {
    const double served = Served(*r, "Infer");
    total += served;
    EXPECT_GE(served, 0.25 * kCalls) << "replica " << r->target();
  }
  EXPECT_EQ(total, kCalls);
}

TEST_P(EachGatewayTest, ASessionCallWithoutTheHeaderSaysWhatToAdd) {
  auto replicas = StartReplicas(3);
  GatewayProcess gateway(GetParam(), Targets(replicas, {0, 1, 2}));
  ASSERT_TRUE(gateway.ok()) << gateway.error();
  auto stub = v1::SessionService::NewStub(client::MakeChannel(gateway.target(), "pick_first"));
  client::SessionClient sessions(gateway.target(), "pick_first", 20000);
  v1::CreateSessionRequest create;
  create.set_kind(v1::SESSION_KIND_SELF);
  auto keyed = sessions.Create(create);
  ASSERT_TRUE(keyed.ok()) << keyed.status();
  // A keyed session's call without its header: whichever replica it
  // reaches, the answer names the header and the value to send.
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    v1::GetSessionRequest get;
    get.set_session_id(keyed->session_id());
    v1::SessionInfo info;
    const grpc::Status status = stub->GetSession(&context, get, &info);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(
        status.error_message().find("carry the metadata header 'x-attention-session: " +
                                    std::string(wire::RoutingKeyOf(keyed->session_id())) + "'"),
        std::string::npos)
        << status.error_message();
  }
  EXPECT_TRUE(sessions.Get(keyed->session_id()).ok());
  // A session created without a key is found only where round robin put
  // it; elsewhere NOT_FOUND says to create sessions with the header.
  grpc::ClientContext context;
  v1::SessionInfo keyless;
  ASSERT_TRUE(stub->CreateSession(&context, create, &keyless).ok());
  int hinted = 0;
  for (int i = 0; i < 6; ++i) {
    grpc::ClientContext get_context;
    v1::GetSessionRequest get;
    get.set_session_id(keyless.session_id());
    v1::SessionInfo info;
    const grpc::Status status = stub->GetSession(&get_context, get, &info);
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      EXPECT_NE(status.error_message().find("behind a gateway, create sessions with the metadata "
                                            "header x-attention-session"),
                std::string::npos)
          << status.error_message();
      ++hinted;
    }
  }
  EXPECT_GE(hinted, 2);
}

// The same session recovery behind HAProxy: a replica SIGKILLed mid-run and
// a fourth added by a reload.
TEST_P(EachGatewayTest, SessionsSurviveAKilledReplicaAndAnAddedOne) {
  auto engine = *MhaEngine::Create(MhaModel::Demo());
  std::mt19937 rng(7);
  std::vector<Tensor> xs;
  std::vector<std::vector<float>> want;
  for (int s = 0; s < 12; ++s) {
    xs.push_back(client::RandomNormal({16, kE}, rng));
    want.push_back(Reference(*engine, xs.back()));
  }
  auto replicas = StartReplicas(4);
  GatewayProcess gateway(GetParam(), Targets(replicas, {0, 1, 2}));
  ASSERT_TRUE(gateway.ok()) << gateway.error();
  client::SessionClient client(gateway.target(), "pick_first", 20000);
  std::deque<client::ReplayingSession> live;
  for (size_t s = 0; s < xs.size(); ++s) live.emplace_back(&client, "");
  const std::vector<Event> events = {
      {0.3, [&] { replicas[0]->Kill(); }},
      {0.6,
       [&] {
         EXPECT_TRUE(gateway.Reload(Targets(replicas, {1, 2, 3}))) << gateway.error();
       }},
  };
  const Decoded run = Decode(4, xs, want, events,
                             [&](int s, const Tensor& token) { return live[s].Append(token); });
  int recoveries = 0;
  for (const auto& session : live) recoveries += session.recoveries();
  EXPECT_EQ(run.errors, 0) << run.first_error << "\n" << gateway.Log();
  EXPECT_EQ(run.wrong_rows, 0);
  EXPECT_GE(recoveries, 1);
  // New sessions now spread over the three replicas listed, the added one included.
  const double before = Reached(*replicas[3], "CreateSession");
  v1::CreateSessionRequest create;
  create.set_kind(v1::SESSION_KIND_SELF);
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(client.Create(create).ok());
  EXPECT_GE(Reached(*replicas[3], "CreateSession") - before, 1)
      << "the reload brought the fourth replica in (" << Reached(*replicas[3], "Append")
      << " appends reached it during the run)";
}

INSTANTIATE_TEST_SUITE_P(Gateways, EachGatewayTest, ::testing::Values(Kind::kNginx, Kind::kHaproxy),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return info.param == Kind::kNginx ? "Nginx" : "Haproxy";
                         });

}  // namespace
}  // namespace attention
