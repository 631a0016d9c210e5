// Scale-out through a real L7 gateway, as platforms deploy it: Debian's nginx
// (and HAProxy) run the reference configurations in deploy/ in front of
// attention-server replicas that clients cannot reach directly. Sessions and
// inference-protocol sequences route by the x-attention-session header; when
// a replica is SIGKILLed, a fourth added (nginx reloaded), and a replica
// removed and added back while it still holds sessions, the callers see no
// error and no wrong row: the clients re-create lost sessions under fresh
// keys and replay them, and expected_length refuses a stale copy. Streams of
// 40 x 64 KiB and an idle stream pass the reference configuration;
// stateless calls (no header) stay round robin; a session call without the
// header says what to add.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <functional>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "attention/v1/attention.grpc.pb.h"
#include "client/cli/client_util.h"
#include "client/cli/session_client.h"
#include "core/mha_engine.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "proto/codec/routing_key.h"
#include "proto/codec/tensor_codec.h"
#include "tests/fixture/oip_requests.h"
#include "tests/fixture/server_test_util.h"
#include "tests/scale_out/gateway_process.h"
#include "tests/scale_out/gateway_test_util.h"
#include "tests/scale_out/replaying_sequence.h"

namespace attention {
namespace {

using testing::GatewayProcess;
using namespace ::attention::gateway_test;  // NOLINT: the shared helpers.

// The full disruption: 30 sequences decoded by 8 clients through nginx in
// front of 3 replicas; replica 1 SIGKILLed, replica 3 added (nginx reloaded,
// the dead one dropped), replica 0 removed while it holds sessions and
// added back. `step` drives one sequence; `method` is what it calls.
struct Disruption {
  Decoded decoded;
  double held_by_removed = 0;  // Sessions replica 0 still held when re-added.
  double served_by_added = 0;  // Calls that reached the added replica.
};
Disruption RunDisruption(std::vector<std::unique_ptr<testing::ServerProcess>>& replicas,
                         GatewayProcess& nginx, const std::vector<Tensor>& xs,
                         const std::vector<std::vector<float>>& want, const std::string& method,
                         const std::function<absl::StatusOr<Tensor>(int, const Tensor&)>& step) {
  Disruption out;
  const std::vector<Event> events = {
      {0.2, [&] { replicas[1]->Kill(); }},
      {0.4,
       [&] {
         EXPECT_TRUE(nginx.Reload(Targets(replicas, {0, 2, 3}))) << nginx.error();
       }},
      {0.6,
       [&] {
         EXPECT_TRUE(nginx.Reload(Targets(replicas, {2, 3}))) << nginx.error();
       }},
      {0.8,
       [&] {
         out.held_by_removed = LiveSessions(*replicas[0]);
         EXPECT_TRUE(nginx.Reload(Targets(replicas, {0, 2, 3}))) << nginx.error();
       }},
  };
  out.decoded = Decode(8, xs, want, events, step);
  out.served_by_added = Reached(*replicas[3], method);
  return out;
}

// How often the sessions or sequences of `live` were re-created or restarted.
template <typename Recovering>
int Recoveries(const std::deque<Recovering>& live) {
  int recoveries = 0;
  for (const Recovering& one : live) recoveries += one.recoveries();
  return recoveries;
}

// No error and no wrong row; the kill, the addition and the removal each
// moved some keys (`recoveries` re-creations or restarts).
void ExpectEveryRowRightAndEveryMoveRecovered(const Disruption& run, int recoveries,
                                              const GatewayProcess& nginx) {
  EXPECT_EQ(run.decoded.errors, 0) << run.decoded.first_error << "\n" << nginx.Log();
  EXPECT_EQ(run.decoded.wrong_rows, 0);
  EXPECT_GE(recoveries, 3);
  EXPECT_GT(run.held_by_removed, 0) << "replica 0 was re-added holding its keys";
  EXPECT_GT(run.served_by_added, 0) << "the reload brought the fourth replica in";
}

// Through nginx (the test is skipped when it is not installed), with 30
// sequences of 24 tokens and their stateless reference rows.
class GatewayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (Skip(Kind::kNginx, &why)) GTEST_SKIP() << why;
    engine_ = *MhaEngine::Create(MhaModel::Demo());
    std::mt19937 rng(26);
    for (int s = 0; s < 30; ++s) {
      xs_.push_back(client::RandomNormal({24, kE}, rng));
      want_.push_back(Reference(*engine_, xs_.back()));
    }
  }
  std::unique_ptr<MhaEngine> engine_;
  std::vector<Tensor> xs_;
  std::vector<std::vector<float>> want_;
};

TEST_F(GatewayTest, SessionsThroughNginxSurviveKillAddRemoveAndReAdd) {
  auto replicas = StartReplicas(4);  // The fourth joins mid-run.
  GatewayProcess nginx(Kind::kNginx, Targets(replicas, {0, 1, 2}));
  ASSERT_TRUE(nginx.ok()) << nginx.error();
  client::SessionClient client(nginx.target(), "pick_first", 20000);
  std::deque<client::ReplayingSession> live;
  for (size_t s = 0; s < xs_.size(); ++s) live.emplace_back(&client, "");
  const Disruption run =
      RunDisruption(replicas, nginx, xs_, want_, "Append",
                    [&](int s, const Tensor& token) { return live[s].Append(token); });
  const int recoveries = Recoveries(live);
  std::cout << "sessions re-created: " << recoveries << "; replica 0 held " << run.held_by_removed
            << " when re-added; the added replica answered " << run.served_by_added << " appends\n";
  ExpectEveryRowRightAndEveryMoveRecovered(run, recoveries, nginx);
}

TEST_F(GatewayTest, SequencesThroughNginxSurviveKillAddRemoveAndReAdd) {
  auto replicas = StartReplicas(4);
  GatewayProcess nginx(Kind::kNginx, Targets(replicas, {0, 1, 2}));
  ASSERT_TRUE(nginx.ok()) << nginx.error();
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(nginx.target(), grpc::InsecureChannelCredentials()));
  std::deque<ReplayingSequence> live;
  for (size_t s = 0; s < xs_.size(); ++s) live.emplace_back(stub.get());
  const Disruption run =
      RunDisruption(replicas, nginx, xs_, want_, "ModelInfer",
                    [&](int s, const Tensor& token) { return live[s].Step(token); });
  const int recoveries = Recoveries(live);
  std::cout << "sequences restarted: " << recoveries << "; replica 0 held " << run.held_by_removed
            << " when re-added\n";
  ExpectEveryRowRightAndEveryMoveRecovered(run, recoveries, nginx);
}

// A key that moves back to a replica still holding an older copy: without
// expected_length a naive client (restarting a sequence under the same id)
// gets wrong rows with no error; with it, FAILED_PRECONDITION. An
// attention.v1 session re-created under the same key has a new id, so the
// old copy can never be reached through it.
TEST_F(GatewayTest, AKeyMovingBackToAStaleCopyIsRefusedNotWrong) {
  auto replicas = StartReplicas(2);
  GatewayProcess nginx(Kind::kNginx, Targets(replicas, {0, 1}));
  ASSERT_TRUE(nginx.ok()) << nginx.error();
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(nginx.target(), grpc::InsecureChannelCredentials()));
  const Tensor& x = xs_[0];
  auto step = [&](uint64_t id, int64_t from, int64_t count, bool start,
                  std::optional<int64_t> expected, std::vector<float>* rows) {
    inference::ModelInferRequest r =
        testing::Fp32InferRequest("demo", "query", {1, count, kE}, x.as<float>() + from * kE);
    (*r.mutable_parameters())["sequence_id"].set_uint64_param(id);
    if (start) (*r.mutable_parameters())["sequence_start"].set_bool_param(true);
    if (expected) (*r.mutable_parameters())["expected_length"].set_int64_param(*expected);
    grpc::ClientContext context;
    context.AddMetadata(wire::kRoutingHeader, std::to_string(id));
    inference::ModelInferResponse response;
    const grpc::Status status = stub->ModelInfer(&context, r, &response);
    if (status.ok() && rows != nullptr) *rows = testing::RawOutputFloats(response);
    return status;
  };
  constexpr uint64_t kId = 4242;
  ASSERT_TRUE(step(kId, 0, 3, true, 0, nullptr).ok());
  const int holder = LiveSessions(*replicas[0]) > 0 ? 0 : 1;
  ASSERT_TRUE(nginx.Reload(Targets(replicas, {1 - holder}))) << nginx.error();
  // The id now reaches the other replica: not there.
  EXPECT_EQ(step(kId, 3, 2, false, 3, nullptr).error_code(), grpc::StatusCode::NOT_FOUND);
  // A naive restart under the same id replays the 3 tokens and goes on to 5.
  ASSERT_TRUE(step(kId, 0, 3, true, 0, nullptr).ok());
  ASSERT_TRUE(step(kId, 3, 2, false, 3, nullptr).ok());
  // The holder comes back with its 3-token copy; the id hashes to it again.
  ASSERT_TRUE(nginx.Reload(Targets(replicas, {0, 1}))) << nginx.error();
  std::vector<float> rows;
  ASSERT_TRUE(step(kId, 5, 1, false, std::nullopt, &rows).ok());
  double diff = 0;
  for (int64_t j = 0; j < kE; ++j)
    diff = std::max(diff, double{std::abs(rows[j] - want_[0][5 * kE + j])});
  EXPECT_GT(diff, 1e-3) << "without expected_length the stale copy answers, wrongly";
  // With it (the copy now holds 4 tokens, the client sent 6): refused.
  const grpc::Status refused = step(kId, 6, 1, false, 6, nullptr);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StartsWith(refused.error_message(), "expected_length: the session holds 4"))
      << refused.error_message();

  // attention.v1: re-created under the same key, the session has a new id.
  client::SessionClient sessions(nginx.target(), "pick_first", 20000);
  v1::CreateSessionRequest create;
  create.set_kind(v1::SESSION_KIND_SELF);
  auto first = sessions.Create(create, "same-key");
  ASSERT_TRUE(first.ok()) << first.status();
  client::SessionClient direct0(replicas[0]->target(), "pick_first", 20000);
  const int session_holder = direct0.Get(first->session_id()).ok() ? 0 : 1;
  ASSERT_TRUE(nginx.Reload(Targets(replicas, {1 - session_holder}))) << nginx.error();
  auto second = sessions.Create(create, "same-key");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->session_id(), first->session_id());
  ASSERT_TRUE(nginx.Reload(Targets(replicas, {0, 1}))) << nginx.error();
  EXPECT_EQ(sessions.Get(second->session_id()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(GatewayTest, LongAndIdleStreamsPassTheReferenceConfig) {
  auto replicas = StartReplicas(3);
  GatewayProcess nginx(Kind::kNginx, Targets(replicas, {0, 1, 2}));
  ASSERT_TRUE(nginx.ok()) << nginx.error();
  auto channel = client::MakeChannel(nginx.target(), "pick_first");
  std::mt19937 rng(40);
  const Tensor x = client::RandomNormal({40 * 64, kE}, rng);  // 40 appends of 64 KiB.
  const std::vector<float> want = Reference(*engine_, x);

  // A SessionStream of one session, opened with its key: 2.5 MiB of body,
  // over nginx's default client_max_body_size of 1 MiB.
  client::SessionClient sessions(nginx.target(), "pick_first", 20000);
  v1::CreateSessionRequest create;
  create.set_kind(v1::SESSION_KIND_SELF);
  auto info = sessions.Create(create);
  ASSERT_TRUE(info.ok()) << info.status();
  {
    grpc::ClientContext context;
    client::SetDeadline(&context, 60000);
    client::SessionClient::SetRoutingKey(&context, info->session_id());
    auto stub = v1::SessionService::NewStub(channel);
    auto stream = stub->SessionStream(&context);
    std::thread writer([&] {
      for (int64_t i = 0; i < 40; ++i) {
        v1::AppendRequest request;
        request.set_session_id(info->session_id());
        request.set_expected_length(i * 64);
        request.set_output_dtype(v1::DATA_TYPE_FLOAT32);
        wire::EncodeTensor(
            Tensor::FromBytes(DType::kFloat32, {64, kE}, x.as<float>() + i * 64 * kE),
            request.mutable_tokens());
        if (!stream->Write(request)) break;
      }
      stream->WritesDone();
    });
    v1::AppendResponse response;
    int64_t rows = 0, wrong = 0;
    while (stream->Read(&response)) {
      ASSERT_FALSE(response.has_error()) << response.error().message();
      const Tensor out = testing::FromProto(response.output());
      for (int64_t j = 0; j < out.num_elements(); ++j) {
        if (std::abs(out.as<float>()[j] - want[rows * kE + j]) > 1e-4) ++wrong;
      }
      rows += out.dim(0);
    }
    writer.join();
    const grpc::Status status = stream->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message() << "\n" << nginx.Log();
    EXPECT_EQ(rows, 40 * 64);
    EXPECT_EQ(wrong, 0);
  }
  // An InferStream of 40 x 64 KiB requests (no key: any replica).
  {
    grpc::ClientContext context;
    client::SetDeadline(&context, 60000);
    auto stub = v1::AttentionService::NewStub(channel);
    auto stream = stub->InferStream(&context);
    v1::InferRequest request;
    wire::EncodeTensor(Tensor::FromBytes(DType::kFloat32, {64, kE}, x.data()),
                       request.mutable_query());
    for (int i = 0; i < 40; ++i) ASSERT_TRUE(stream->Write(request));
    stream->WritesDone();
    v1::InferResponse response;
    int ok = 0;
    while (stream->Read(&response)) ok += !response.has_error();
    EXPECT_TRUE(stream->Finish().ok()) << nginx.Log();
    EXPECT_EQ(ok, 40);
  }
}

// nginx resets a stream that sends nothing for client_body_timeout (60 s by
// default; the reference config raises it to 1 h). Scaled down to keep the
// test short: the same 2 s idle stream is reset under a 1 s timeout and
// passes under a 4 s one, every other directive the reference's. The idle
// time is the subject here, so it is waited for.
TEST_F(GatewayTest, AnIdleStreamOutlivesTheBodyTimeoutOnlyWhenItIsRaised) {
  auto replicas = StartReplicas(1);
  GatewayProcess short_timeout(Kind::kNginx, Targets(replicas, {0}),
                               {{"client_body_timeout", "1s"}});
  GatewayProcess raised(Kind::kNginx, Targets(replicas, {0}), {{"client_body_timeout", "4s"}});
  ASSERT_TRUE(short_timeout.ok()) << short_timeout.error();
  ASSERT_TRUE(raised.ok()) << raised.error();
  auto idle_stream = [&](const std::string& target, grpc::Status* status) {
    auto stub = v1::AttentionService::NewStub(client::MakeChannel(target, "pick_first"));
    grpc::ClientContext context;
    client::SetDeadline(&context, 30000);
    auto stream = stub->InferStream(&context);
    v1::InferRequest request;
    std::mt19937 rng(1);
    wire::EncodeTensor(client::RandomNormal({4, kE}, rng), request.mutable_query());
    v1::InferResponse response;
    int answered = 0;
    for (int i = 0; i < 2; ++i) {
      if (i == 1) std::this_thread::sleep_for(std::chrono::seconds(2));  // Idle.
      if (!stream->Write(request) || !stream->Read(&response)) break;
      answered += !response.has_error();
    }
    stream->WritesDone();
    while (stream->Read(&response)) {
    }
    *status = stream->Finish();
    return answered;
  };
  grpc::Status reset, passed;
  int answered_short = 0, answered_raised = 0;
  std::thread a([&] { answered_short = idle_stream(short_timeout.target(), &reset); });
  std::thread b([&] { answered_raised = idle_stream(raised.target(), &passed); });
  a.join();
  b.join();
  EXPECT_EQ(answered_raised, 2);
  EXPECT_TRUE(passed.ok()) << passed.error_message();
  EXPECT_EQ(answered_short, 1);
  EXPECT_FALSE(reset.ok()) << "the 1 s body timeout should have reset the idle stream";
}

}  // namespace
}  // namespace attention
