// The connection age (ServerOptions::max_connection_age, --max_connection_age_s)
// against streams in use. After the age the server sends GOAWAY: new calls
// go to a new connection (and re-resolve the name, reaching new replicas),
// while the streams open on the old one go on; by default for as long as the
// client keeps them (connection_age_grace infinite), so an InferStream or a
// SessionStream is never cut because its connection is old. A finite grace
// still cuts them (UNAVAILABLE), as the default of 30 s did 90 s into every
// connection; the clients then reopen their streams (their own tests).
#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <random>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "tests/fixture/own_server_test.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/small_server_options.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::server::ServerOptions;

constexpr int64_t kE = 16;  // SmallServerOptions' model "small".

class ConnectionAgeTest : public testing::OwnServerTest {
 protected:
  // Starts a small server (SmallServerOptions(`name`)) whose connections age
  // after 200 ms, with `tweak` applied to its options.
  [[nodiscard]] bool StartAged(const std::string& name,
                               const std::function<void(ServerOptions&)>& tweak = nullptr) {
    ServerOptions o = testing::SmallServerOptions(name);
    o.max_connection_age = absl::Milliseconds(200);
    if (tweak != nullptr) tweak(o);
    return Start(o);
  }
};

// Waits for the server's GOAWAY: the channel, READY for the calls made so
// far, leaves READY once its connection takes no new calls (it may have
// already). False if that did not happen in 30 s.
bool WaitForGoaway(grpc::Channel* channel) {
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30);
  while (channel->GetState(false) == GRPC_CHANNEL_READY) {
    if (!channel->WaitForStateChange(GRPC_CHANNEL_READY, deadline)) return false;
  }
  return true;
}

v1::InferRequest Query(std::mt19937& rng, int i) {
  v1::InferRequest request;
  request.set_model("small");
  request.set_request_id("q" + std::to_string(i));
  testing::ToProto(testing::RandomTensor({1, 3, kE}, rng), request.mutable_query());
  return request;
}

// One request on `stream`, answered OK with its id; false once the stream is
// broken (the caller then reads its status with Finish()).
bool RoundTrip(grpc::ClientReaderWriter<v1::InferRequest, v1::InferResponse>* stream,
               const v1::InferRequest& request) {
  v1::InferResponse response;
  if (!stream->Write(request) || !stream->Read(&response)) return false;
  EXPECT_FALSE(response.has_error()) << response.error().message();
  EXPECT_EQ(response.request_id(), request.request_id());
  return true;
}

TEST_F(ConnectionAgeTest, TheDefaultGraceLetsOpenCallsRunToTheirEnd) {
  EXPECT_EQ(ServerOptions().connection_age_grace, absl::InfiniteDuration());
}

// With the default grace, an InferStream and a SessionStream opened on a
// connection keep answering long after its age (a GOAWAY seen, then ten
// times the age), while a new call on the same channel goes through a new
// connection.
TEST_F(ConnectionAgeTest, StreamsInUseOutliveTheConnectionAge) {
  ASSERT_TRUE(StartAged("connection_age_default"));
  auto sessions = v1::SessionService::NewStub(channel_);
  std::mt19937 rng(5);

  grpc::ClientContext create_context;
  v1::CreateSessionRequest create;
  create.set_model("small");
  create.set_kind(v1::SESSION_KIND_SELF);
  v1::SessionInfo info;
  ASSERT_TRUE(sessions->CreateSession(&create_context, create, &info).ok());

  grpc::ClientContext infer_context, session_context;
  auto infer = stub_->InferStream(&infer_context);
  auto appends = sessions->SessionStream(&session_context);
  int64_t length = 0;
  auto append = [&]() {
    v1::AppendRequest request;
    request.set_session_id(info.session_id());
    request.set_expected_length(length);
    testing::ToProto(testing::RandomTensor({1, kE}, rng), request.mutable_tokens());
    v1::AppendResponse response;
    if (!appends->Write(request) || !appends->Read(&response)) return false;
    EXPECT_FALSE(response.has_error()) << response.error().message();
    length = response.length();
    return true;
  };
  int i = 0;
  ASSERT_TRUE(RoundTrip(infer.get(), Query(rng, i++)));
  ASSERT_TRUE(append());

  ASSERT_TRUE(WaitForGoaway(channel_.get()));
  const absl::Time goaway = absl::Now();
  // A new call after the GOAWAY: on a new connection.
  grpc::ClientContext unary_context;
  v1::InferResponse unary;
  ASSERT_TRUE(stub_->Infer(&unary_context, Query(rng, 1000), &unary).ok());
  while (absl::Now() < goaway + absl::Seconds(2)) {
    ASSERT_TRUE(RoundTrip(infer.get(), Query(rng, i++)))
        << infer->Finish().error_message() << " (request " << i << ")";
    ASSERT_TRUE(append()) << appends->Finish().error_message();
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(length, i);
  infer->WritesDone();
  EXPECT_TRUE(infer->Finish().ok());
  appends->WritesDone();
  EXPECT_TRUE(appends->Finish().ok());
  EXPECT_TRUE(server_->Drain());
}

// A finite grace ends the streams still open after age + grace with
// UNAVAILABLE (what the clients' reopening recovers from).
TEST_F(ConnectionAgeTest, AFiniteGraceCutsAStreamStillOpen) {
  ASSERT_TRUE(StartAged("connection_age_finite", [](ServerOptions& o) {
    o.connection_age_grace = absl::Milliseconds(300);
  }));
  std::mt19937 rng(6);
  grpc::ClientContext context;
  testing::PrepareContext(context, /*token=*/"", absl::Seconds(60));
  auto infer = stub_->InferStream(&context);
  int i = 0;
  while (RoundTrip(infer.get(), Query(rng, i++))) absl::SleepFor(absl::Milliseconds(50));
  const grpc::Status status = infer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_GT(i, 1);
  EXPECT_TRUE(server_->Drain());
}

// With no grace limit, a drain still ends the streams left open: after the
// drain timeout they are cancelled, and the drain returns.
TEST_F(ConnectionAgeTest, ADrainEndsAStreamLeftOpen) {
  ASSERT_TRUE(StartAged("connection_age_drain",
                        [](ServerOptions& o) { o.drain_timeout = absl::Milliseconds(500); }));
  std::mt19937 rng(7);
  grpc::ClientContext context;
  auto infer = stub_->InferStream(&context);
  ASSERT_TRUE(RoundTrip(infer.get(), Query(rng, 0)));
  ASSERT_TRUE(WaitForGoaway(channel_.get()));  // Aged: only the grace would have ended it.
  EXPECT_TRUE(server_->Drain());               // Every accepted request was answered.
  v1::InferResponse response;
  EXPECT_FALSE(infer->Read(&response));
  EXPECT_FALSE(infer->Finish().ok());
}

}  // namespace
}  // namespace attention
