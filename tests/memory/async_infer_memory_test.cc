// Memory held by attention.v1 Infer on gRPC's async API (its queue's tests
// are tests/attention_api/async_infer_queue_test): what an answered call
// holds while its client has not read the response, and (disabled: a
// benchmark, timing) small calls beside clients sending large requests.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "attention/v1/attention.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "server/batching/model_bytes.h"
#include "tests/fixture/async_infer_test_util.h"
#include "tests/fixture/small_server_options.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::testing::RandomTensor;
using ::attention::testing::ToProto;
using namespace ::attention::async_infer_testing;  // NOLINT: the file's helpers.

class AsyncInferMemoryTest : public AsyncInferServerTest {};

// A version unloaded once its call has been computed goes as soon as the
// batch is done, as on the callback path (the version is held by the queued
// work, not by the transport): a client that has not read its (large)
// response yet must not keep the unloaded weights resident, which would
// also refuse loading them again under --max_model_bytes.
TEST_F(AsyncInferMemoryTest, UnreadResponseDoesNotPinAnUnloadedVersion) {
  server::ServerOptions options = SmallServerOptions("async_infer_memory_pin");
  options.repository.control = server::ModelControl::kExplicit;
  // One copy of its resident weights, not two.
  const int64_t limit = server::EstimateModelBytes(options.repository.path + "/small") * 3 / 2;
  options.repository.max_model_bytes = limit;
  ASSERT_TRUE(Start(options));
  const int64_t resident = server_->repository()->resident_bytes();
  ASSERT_GT(resident, 0);
  ASSERT_LE(resident, limit);
  ASSERT_GT(2 * resident, limit);
  // No BDP probing: the stream's window stays at its initial size until the
  // client asks for the response, so an 8 MiB response waits in the server.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetMaxReceiveMessageSize(-1);
  auto stub = v1::AttentionService::NewStub(grpc::CreateCustomChannel(
      testing::Target(*server_), grpc::InsecureChannelCredentials(), args));
  std::mt19937 rng(8);
  v1::InferRequest request = SmallRequest(rng, 1024, "unread");
  request.set_need_weights(true);
  request.set_per_head_weights(true);  // 2 x 1024 x 1024 float32: 8 MiB.
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  // Sent with the request for initial metadata only: the response is not
  // asked for until Finish().
  auto rpc = stub->AsyncInfer(&context, request, &cq);
  rpc->ReadInitialMetadata(reinterpret_cast<void*>(2));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));  // The server answered (its metadata come with it).
  ASSERT_EQ(tag, reinterpret_cast<void*>(2));
  ASSERT_TRUE(WaitFor([&] { return Count(*server_, absl::StatusCode::kOk) == 1; }));
  const absl::Status unloaded = server_->repository()->UnloadModel("small");
  ASSERT_TRUE(unloaded.ok()) << unloaded;
  EXPECT_TRUE(
      WaitFor([&] { return server_->repository()->resident_bytes() == 0; }, absl::Seconds(3)))
      << server_->repository()->resident_bytes() << " bytes of the unloaded version still resident "
      << "while its answered call waits for the client to read";
  // Loading it again fits the budget once the unloaded copy is gone.
  const absl::Status reloaded = server_->repository()->LoadModel("small");
  EXPECT_TRUE(reloaded.ok()) << reloaded;
  v1::InferResponse response;
  grpc::Status status;
  rpc->Finish(&response, &status, reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_TRUE(ok);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.model_version(), 1);
  EXPECT_TRUE(server_->Drain());
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// Latencies of small calls in milliseconds, sorted: one at a time on
// `stub` for `duration`, each after a random pause of 0-5 ms when `pauses`.
std::vector<double> SmallCallLatencies(v1::AttentionService::Stub* stub,
                                       const v1::InferRequest& small, absl::Duration duration,
                                       bool pauses, std::mt19937& rng) {
  std::vector<double> ms;
  const absl::Time until = absl::Now() + duration;
  while (absl::Now() < until) {
    if (pauses) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 5000));
    const absl::Time t0 = absl::Now();
    EXPECT_TRUE(InferOnce(stub, small).ok());
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }
  std::sort(ms.begin(), ms.end());
  return ms;
}

double Percentile(const std::vector<double>& sorted, int p) {
  return sorted.empty() ? 0 : sorted[sorted.size() * p / 100];
}

void PrintLatencies(const char* what, const std::vector<double>& ms) {
  std::printf("%-8s small calls %5zu  p50 %7.2f  p90 %7.2f  p99 %7.2f  max %7.2f ms\n", what,
              ms.size(), Percentile(ms, 50), Percentile(ms, 90), Percentile(ms, 99),
              ms.empty() ? 0 : ms.back());
}

// A channel to `server` on a connection of its own (gRPC otherwise shares
// one between channels to the same target): each client below is a client
// of its own, as on separate machines, rather than streams of one HTTP/2
// connection, where the small call's bytes would queue behind the large
// ones on the socket whatever the server did. With `shared`, the channels
// share one connection (how this benchmark ran before issue 36's fix).
std::shared_ptr<grpc::Channel> ClientChannel(const server::AttentionServer& server, bool shared) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  if (!shared) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(testing::Target(server), grpc::InsecureChannelCredentials(),
                                   args);
}

// Issue 36's goal for small calls beside large requests: their p90 at most
// 4 times their p90 alone, plus 5 ms. Measures it on `server` (batches sent
// at once): the small call alone for 2 s, then for 4 s beside two clients
// sending 32 MiB requests (refused after decoding: wrong width).
void MeasureSmallCallsBesideLargeRequests(server::AttentionServer& server, bool pauses) {
  // HOL_SHARED_CONNECTION=1: every client on one connection.
  const bool shared = getenv("HOL_SHARED_CONNECTION") != nullptr;
  auto stub = v1::AttentionService::NewStub(ClientChannel(server, shared));
  std::mt19937 rng(10);
  const v1::InferRequest small = SmallRequest(rng, 4, "s");
  ASSERT_TRUE(InferOnce(stub.get(), small).ok());
  const std::vector<double> alone =
      SmallCallLatencies(stub.get(), small, absl::Seconds(2), pauses, rng);
  std::atomic<bool> stop{false};
  std::atomic<int> large_calls{0};
  std::vector<std::thread> big;
  std::mt19937 brng(9);
  v1::InferRequest large;
  large.set_model("small");
  ToProto(RandomTensor({1, 1 << 20, 8}, brng), large.mutable_query());  // Wrong width.
  for (int t = 0; t < 2; ++t) {
    big.emplace_back([&] {
      auto big_stub = v1::AttentionService::NewStub(ClientChannel(server, shared));
      while (!stop.load()) {
        EXPECT_EQ(InferOnce(big_stub.get(), large).error_code(),
                  grpc::StatusCode::INVALID_ARGUMENT);
        ++large_calls;
      }
    });
  }
  // Both senders under way before the clock starts.
  while (large_calls.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::vector<double> beside =
      SmallCallLatencies(stub.get(), small, absl::Seconds(4), pauses, rng);
  stop = true;
  for (auto& t : big) t.join();
  std::printf("%s, %s\n",
              pauses ? "small calls after random 0-5 ms pauses" : "small calls back to back",
              shared ? "every client on one connection" : "each client on its own connection");
  PrintLatencies("alone", alone);
  PrintLatencies("beside", beside);
  std::printf("large requests answered: %d\n", large_calls.load());
  const double goal = 4 * Percentile(alone, 90) + 5;
  std::printf("goal: p90 beside <= 4 x p90 alone + 5 ms = %.2f ms: %s\n", goal,
              Percentile(beside, 90) <= goal ? "met" : "NOT met");
  EXPECT_LE(Percentile(beside, 90), goal);
}

// A benchmark, not a test (timing): run by hand with
// --gtest_also_run_disabled_tests (BENCHMARKS.md). Small calls beside
// clients sending large requests (32 MiB each, refused after decoding).
// Before issue 36 the one infer-cq thread received, parsed and decoded
// every Infer, so the small calls waited behind the large ones: on 2 cores,
// 4 s each, two runs: async (72bdbe4) 186 and 285 small calls, p90 62 and
// 61 ms, p99 104 and 96 ms; callback (8349fe9) 1511 and 970 calls, p90 5.2
// and 17.9 ms, p99 42 and 46 ms.
TEST_F(AsyncInferMemoryTest, DISABLED_SmallCallsAreNotHeldBehindLargeRequests) {
  server::ServerOptions options = SmallServerOptions("async_infer_memory_hol");
  options.repository.batching.max_queue_delay_us = 0;
  ASSERT_TRUE(Start(options));
  MeasureSmallCallsBesideLargeRequests(*server_, /*pauses=*/false);
  EXPECT_TRUE(server_->Drain());
}

// The same with a random pause of 0-5 ms before each small call (issue 36's
// second measurement: p90 17-138 ms beside the large senders, ~1 ms alone).
TEST_F(AsyncInferMemoryTest, DISABLED_SmallCallsWithPausesAreNotHeldBehindLargeRequests) {
  server::ServerOptions options = SmallServerOptions("async_infer_memory_hol_pauses");
  options.repository.batching.max_queue_delay_us = 0;
  ASSERT_TRUE(Start(options));
  MeasureSmallCallsBesideLargeRequests(*server_, /*pauses=*/true);
  EXPECT_TRUE(server_->Drain());
}

}  // namespace
}  // namespace attention
