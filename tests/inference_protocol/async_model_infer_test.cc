// The inference protocol's ModelInfer on gRPC's async API
// (AsyncModelInferCall, served by AsyncInferQueue beside attention.v1
// Infer): the token is checked from the call's metadata before anything is
// parsed; a large request is parsed on the parse pool, so small calls of
// either protocol complete while it is held there; large requests compute
// exactly; every call is counted received and answered once, whatever its
// answer; a drain answers a request the pool holds. The pool's test hook
// holds a request in the pool; no timing.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/mha_engine.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/attention_server.h"
#include "server/frontends/grpc/async_unary_call.h"
#include "server/frontends/protocol/oip_codec.h"
#include "tests/fixture/async_infer_test_util.h"
#include "tests/fixture/token_files.h"
#include "tests/inference_protocol/async_model_infer_probes.h"

namespace attention {
namespace {

using namespace ::attention::async_infer_testing;  // NOLINT: the file's helpers.
using namespace ::attention::oip_async_probes;     // NOLINT: the file's helpers.
using server::AsyncUnaryCall;

constexpr char kModelInfer[] = "/inference.GRPCInferenceService/ModelInfer";

// Call() with `token` (none when empty).
grpc::Status ModelInferOnce(GRPCInferenceService::Stub* stub, const ModelInferRequest& request,
                            ModelInferResponse* response, const std::string& token = "") {
  grpc::ClientContext context;
  testing::PrepareContext(context, token);
  return Call(stub, request, response, &context);
}

class AsyncModelInferTest : public AsyncModelInferProbeTest {
 protected:
  server::ParsePool& pool() { return server_->infer_queue().parse_pool(); }
  // The small model's output for `query` (float32, as the wire carries it).
  Tensor Expected(const Tensor& query) {
    MhaInputs in;
    in.query = query.view();
    return (*server_->repository()->Find("small")->engine->Forward(in)).output;
  }
  static void ExpectOutput(const Tensor& expected, const ModelInferResponse& response) {
    ASSERT_EQ(response.raw_output_contents_size(), 1);
    ASSERT_EQ(response.raw_output_contents(0).size(), expected.num_bytes());
    const float* got = reinterpret_cast<const float*>(response.raw_output_contents(0).data());
    for (int64_t i = 0; i < expected.num_elements(); ++i) {
      ASSERT_NEAR(got[i], expected.as<float>()[i], 1e-5) << "element " << i;
    }
  }
};

TEST_F(AsyncModelInferTest, TokenIsCheckedBeforeTheRequestIsParsed) {
  server::ServerOptions options = SmallServerOptions("async_oip_token");
  options.auth_tokens_file = options.repository.path + ".tokens";
  testing::WriteTokens(options.auth_tokens_file,
                       absl::StrCat(testing::HashHex("alice-secret"), " alice small\n"));
  ASSERT_TRUE(Start(options));
  std::mt19937 rng(1);
  const Tensor query = RandomTensor({80, 64, 16}, rng);
  const ModelInferRequest large = Request(query, "large");
  ASSERT_GT(static_cast<int64_t>(large.ByteSizeLong()), AsyncUnaryCall::kInlineParseBytes);
  ModelInferResponse response;
  // Without a token, or with an unknown one: refused, never parsed.
  EXPECT_EQ(ModelInferOnce(oip_.get(), large, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  grpc::GenericStub generic(channel_);
  EXPECT_EQ(RawCall(&generic, kModelInfer, large.SerializeAsString(), "mallory").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Bytes that do not even parse: the token is refused first.
  EXPECT_EQ(RawCall(&generic, kModelInfer, std::string("\x0a\xff\xff\x03zz", 6)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(pool().posted(), 0);
  // With the token: parsed on the pool, computed, exact.
  const grpc::Status ok = ModelInferOnce(oip_.get(), large, &response, "alice-secret");
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(pool().posted(), 1);
  EXPECT_EQ(response.id(), "large");
  EXPECT_EQ(response.model_name(), "small");
  ExpectOutput(Expected(query), response);
  // With the token, bytes that do not parse are INVALID_ARGUMENT.
  const grpc::Status garbage =
      RawCall(&generic, kModelInfer, std::string("\x0a\xff\xff\x03zz", 6), "alice-secret");
  EXPECT_EQ(garbage.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(garbage.error_message().find("inference.ModelInferRequest"), std::string::npos)
      << garbage.error_message();
  EXPECT_TRUE(server_->Drain());
}

TEST_F(AsyncModelInferTest, SmallCallsOfBothProtocolsCompleteWhileALargeOneIsHeldInTheParsePool) {
  ASSERT_TRUE(Start(SmallServerOptions("async_oip_hold")));
  std::mt19937 rng(2);
  const Tensor query = RandomTensor({80, 64, 16}, rng);
  PendingModelInfer large(Request(query, "large"));
  {
    PoolLatch latch(pool());
    large.Start(oip_.get());
    ASSERT_TRUE(latch.WaitEntered()) << "the large request never reached the parse pool";
    const Tensor small_query = RandomTensor({1, 3, 16}, rng);
    ModelInferResponse small;
    const grpc::Status status =
        ModelInferOnce(oip_.get(), Request(small_query, "small-oip"), &small);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(small.id(), "small-oip");
    ExpectOutput(Expected(small_query), small);
    v1::InferResponse v1_response;
    const grpc::Status v1_status =
        InferOnce(stub_.get(), SmallRequest(rng, 3, "small-v1"), &v1_response);
    EXPECT_TRUE(v1_status.ok()) << v1_status.error_message();
    EXPECT_FALSE(large.done.HasBeenNotified());
    // Its bytes count in the in-flight budget while it waits.
    EXPECT_GT(server_->service().inflight_bytes(), AsyncUnaryCall::kInlineParseBytes);
  }
  ASSERT_TRUE(large.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(large.status.ok()) << large.status.error_message();
  ExpectOutput(Expected(query), large.response);
  EXPECT_TRUE(server_->Drain());
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
}

TEST_F(AsyncModelInferTest, EachCallIsCountedOnceWhateverItsAnswer) {
  ASSERT_TRUE(Start(SmallServerOptions("async_oip_count")));
  std::mt19937 rng(3);
  ModelInferResponse response;
  // Computed, inline and on the pool.
  ASSERT_TRUE(
      ModelInferOnce(oip_.get(), Request(RandomTensor({1, 4, 16}, rng), "a"), &response).ok());
  ASSERT_TRUE(
      ModelInferOnce(oip_.get(), Request(RandomTensor({80, 64, 16}, rng), "b"), &response).ok());
  // Refused after the model was found: the model counts it.
  EXPECT_EQ(ModelInferOnce(oip_.get(), Request(RandomTensor({1, 4, 15}, rng), "c"), &response)
                .error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Refused before: an unknown model, and bytes that do not parse.
  ModelInferRequest unknown = Request(RandomTensor({1, 4, 16}, rng), "d");
  unknown.set_model_name("nope");
  EXPECT_EQ(ModelInferOnce(oip_.get(), unknown, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
  grpc::GenericStub generic(channel_);
  EXPECT_EQ(RawCall(&generic, kModelInfer, std::string("\x0a\xff\xff\x03zz", 6)).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Answered(absl::StatusCode::kOk), 2);
  EXPECT_EQ(Answered(absl::StatusCode::kInvalidArgument), 1);
  // Received and answered once each: nothing stays in flight.
  EXPECT_TRUE(WaitFor([&] { return server_->metrics().inflight_requests().Value() == 0; }))
      << server_->metrics().inflight_requests().Value();
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
  EXPECT_TRUE(server_->Drain());
}

TEST_F(AsyncModelInferTest, DrainAnswersARequestHeldInTheParsePool) {
  ASSERT_TRUE(Start(SmallServerOptions("async_oip_drain")));
  std::mt19937 rng(4);
  PendingModelInfer large(Request(RandomTensor({80, 64, 16}, rng), "large"));
  EXPECT_TRUE(DrainWithACallHeldInTheParsePool(*server_, pool(), large, oip_.get()));
  // Not parsed when the drain began: refused as one arriving then would be.
  ASSERT_TRUE(large.done.HasBeenNotified());
  EXPECT_EQ(large.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << large.status.error_message();
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
}

}  // namespace
}  // namespace attention
