// Where attention.v1 Infer's requests are parsed (AsyncInferCall,
// ParsePool): a request larger than AsyncInferCall::kInlineParseBytes is
// parsed on the parse pool, so a small call completes while a large one is
// held there; the token is checked from the call's metadata before anything
// is parsed; large requests compute as small ones do, and requests that do
// not parse are INVALID_ARGUMENT; a drain waits for and answers a request
// the pool holds, and a shutdown that cancels it still ends. The pool's test hook holds a
// request in the pool; no timing.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "attention/v1/attention.grpc.pb.h"
#include "core/mha_engine.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "server/frontends/grpc/async_infer_call.h"
#include "tests/fixture/async_infer_test_util.h"
#include "tests/fixture/small_server_options.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"
#include "tests/fixture/token_files.h"

namespace attention {
namespace {

constexpr char kInfer[] = "/attention.v1.AttentionService/Infer";

using ::attention::testing::FromProto;
using namespace ::attention::async_infer_testing;  // NOLINT: the file's helpers.
using server::AsyncInferCall;
using server::ParsePool;

// A request of `batch` sequences of 64 tokens: past the inline limit from a
// batch of 80 (320 KiB of query).
v1::InferRequest BatchRequest(std::mt19937& rng, int64_t batch, const std::string& id) {
  v1::InferRequest r;
  r.set_model("small");
  r.set_request_id(id);
  ToProto(RandomTensor({batch, 64, 16}, rng), r.mutable_query());
  return r;
}

v1::InferRequest LargeRequest(std::mt19937& rng, const std::string& id) {
  v1::InferRequest r = BatchRequest(rng, 80, id);
  EXPECT_GT(static_cast<int64_t>(r.ByteSizeLong()), AsyncInferCall::kInlineParseBytes);
  return r;
}

class AsyncInferParseTest : public AsyncInferServerTest {
 protected:
  ParsePool& pool() { return server_->infer_queue().parse_pool(); }
};

TEST_F(AsyncInferParseTest, SmallCallCompletesWhileALargeRequestIsHeldInTheParsePool) {
  ASSERT_TRUE(Start(SmallServerOptions("async_parse_hold")));
  std::mt19937 rng(1);
  PendingCall large(LargeRequest(rng, "large"));
  {
    PoolLatch latch(pool());
    large.Start(stub_.get());
    ASSERT_TRUE(latch.WaitEntered()) << "the large request never reached the parse pool";
    // The one infer-cq thread is free: a small call is received, parsed,
    // computed and answered meanwhile.
    v1::InferResponse response;
    const grpc::Status small = InferOnce(stub_.get(), SmallRequest(rng, 3, "small"), &response);
    EXPECT_TRUE(small.ok()) << small.error_message();
    EXPECT_EQ(response.request_id(), "small");
    EXPECT_FALSE(large.done.HasBeenNotified());
    EXPECT_GT(pool().queued_bytes(), AsyncInferCall::kInlineParseBytes);
    // Its bytes count in the in-flight budget while it waits.
    EXPECT_GT(server_->service().inflight_bytes(), AsyncInferCall::kInlineParseBytes);
  }
  ASSERT_TRUE(large.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(large.status.ok()) << large.status.error_message();
  EXPECT_EQ(large.response.request_id(), "large");
  EXPECT_EQ(pool().posted(), 1);
  EXPECT_TRUE(server_->Drain());
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
}

TEST_F(AsyncInferParseTest, TokenIsCheckedBeforeTheRequestIsParsed) {
  server::ServerOptions options = SmallServerOptions("async_parse_token");
  options.auth_tokens_file = options.repository.path + ".tokens";
  testing::WriteTokens(options.auth_tokens_file,
                       absl::StrCat(testing::HashHex("alice-secret"), " alice small\n"));
  ASSERT_TRUE(Start(options));
  std::mt19937 rng(2);
  const v1::InferRequest large = LargeRequest(rng, "large");
  // Without a token, or with an unknown one: refused, never parsed.
  EXPECT_EQ(InferOnce(stub_.get(), large).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::GenericStub generic(channel_);
  EXPECT_EQ(RawCall(&generic, kInfer, large.SerializeAsString(), "mallory").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Bytes that do not even parse: the token is refused first.
  EXPECT_EQ(RawCall(&generic, kInfer, std::string("\x0a\xff\xff\x03zz", 6)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(pool().posted(), 0);
  // With the token it is parsed (on the pool) and computed.
  grpc::ClientContext context;
  testing::PrepareContext(context, "alice-secret");
  v1::InferResponse response;
  const grpc::Status ok = stub_->Infer(&context, large, &response);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(pool().posted(), 1);
  EXPECT_TRUE(server_->Drain());
}

TEST_F(AsyncInferParseTest, LargeRequestsComputeAsSmallOnesAndUnparsableOnesAreInvalid) {
  ASSERT_TRUE(Start(SmallServerOptions("async_parse_large")));
  const MhaEngine& engine = *server_->repository()->Find("small")->engine;
  std::mt19937 rng(3);
  for (int64_t batch : {2, 80, 120}) {  // Inline, then on the pool.
    const v1::InferRequest request = BatchRequest(rng, batch, "b" + std::to_string(batch));
    v1::InferResponse response;
    const grpc::Status status = InferOnce(stub_.get(), request, &response);
    ASSERT_TRUE(status.ok()) << batch << ": " << status.error_message();
    EXPECT_EQ(response.request_id(), request.request_id());
    const Tensor query = FromProto(request.query());
    MhaInputs in;
    in.query = query.view();
    const MhaOutputs solo = *engine.Forward(in);
    const Tensor got = FromProto(response.output());
    ASSERT_EQ(got.shape(), solo.output.shape()) << batch;
    for (int64_t j = 0; j < got.num_elements(); ++j) {
      ASSERT_NEAR(got.as<float>()[j], solo.output.as<float>()[j], 1e-5) << batch << " at " << j;
    }
  }
  EXPECT_EQ(pool().posted(), 2);
  // Cut short inside the query's bytes: not a message, small or large.
  grpc::GenericStub generic(channel_);
  for (int64_t batch : {2, 80}) {
    const std::string bytes = BatchRequest(rng, batch, "cut").SerializeAsString();
    const grpc::Status cut = RawCall(&generic, kInfer, bytes.substr(0, bytes.size() - 3));
    EXPECT_EQ(cut.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << batch << ": " << cut.error_code() << " " << cut.error_message();
    EXPECT_NE(cut.error_message().find("do not parse as an attention.v1.InferRequest"),
              std::string::npos)
        << cut.error_message();
  }
  EXPECT_EQ(pool().posted(), 3);
  // Refused once its model was found (the wrong width), inline and on the
  // pool: each counted under the model, as the unparsable ones cannot be.
  for (int64_t length : {4, 1 << 14}) {
    v1::InferRequest wrong;
    wrong.set_model("small");
    ToProto(RandomTensor({1, length, 8}, rng), wrong.mutable_query());
    EXPECT_EQ(InferOnce(stub_.get(), wrong).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(pool().posted(), 4);
  EXPECT_EQ(Count(*server_, absl::StatusCode::kInvalidArgument), 2);
  EXPECT_TRUE(server_->Drain());
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
}

TEST_F(AsyncInferParseTest, DrainWaitsForAndAnswersARequestHeldInTheParsePool) {
  ASSERT_TRUE(Start(SmallServerOptions("async_parse_drain")));
  std::mt19937 rng(4);
  PendingCall large(LargeRequest(rng, "large"));
  EXPECT_TRUE(DrainWithACallHeldInTheParsePool(*server_, pool(), large, stub_.get()));
  // Not yet parsed when the drain began, it is refused as one arriving then
  // would be (the batchers take no new work): answered, never lost.
  ASSERT_TRUE(large.done.HasBeenNotified());
  EXPECT_EQ(large.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << large.status.error_message();
  EXPECT_EQ(large.status.error_message(), "server is shutting down");
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
}

TEST_F(AsyncInferParseTest, ShutdownCancellingARequestHeldInTheParsePoolStillEnds) {
  server::ServerOptions options = SmallServerOptions("async_parse_shutdown");
  options.drain_timeout = absl::Milliseconds(200);
  ASSERT_TRUE(Start(options));
  std::mt19937 rng(5);
  PendingCall large(LargeRequest(rng, "large"));
  absl::Notification drained;
  bool idle = true;
  std::thread drain;
  {
    PoolLatch latch(pool());
    large.Start(stub_.get());
    ASSERT_TRUE(latch.WaitEntered());
    drain = std::thread([&] {
      idle = server_->Drain();
      drained.Notify();
    });
    // The drain times out and the shutdown cancels the call; the pool still
    // holds it, so the server cannot be done with it yet.
    EXPECT_TRUE(large.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_FALSE(drained.HasBeenNotified());
  }
  EXPECT_FALSE(large.status.ok());
  ASSERT_TRUE(drained.WaitForNotificationWithTimeout(absl::Seconds(30))) << "Drain hangs";
  drain.join();
  EXPECT_FALSE(idle);
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
  EXPECT_EQ(server_->metrics().inflight_requests().Value(), 0);
}

}  // namespace
}  // namespace attention
