// Review probes of the life of ModelInfer calls on gRPC's async API
// (AsyncModelInferCall): an unread response keeps its admission but not an
// unloaded version; a full queue refuses, counted once; a drain past its
// timeout with a sequence step waiting in its session's queue ends; a
// deadline passing while queued is answered without compute; many mixed
// calls with cancellations all end (for the sanitizers).
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/mha_engine.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/attention_server.h"
#include "server/batching/model_bytes.h"
#include "server/frontends/grpc/async_unary_call.h"
#include "tests/fixture/async_infer_test_util.h"
#include "tests/fixture/token_files.h"
#include "tests/inference_protocol/async_model_infer_probes.h"

namespace attention {
namespace {

using namespace ::attention::async_infer_testing;  // NOLINT: the helpers.
using namespace ::attention::oip_async_probes;     // NOLINT: the helpers.
using server::AsyncUnaryCall;

// As attention.v1's UnreadResponseDoesNotPinAnUnloadedVersion, for
// ModelInfer: the answered call keeps its admission (its response is in
// flight) but not the version it was computed on.
TEST_F(AsyncModelInferProbeTest, UnreadResponseHoldsTheBudgetButNotAnUnloadedVersion) {
  server::ServerOptions options = SmallServerOptions("rev_oip_unread");
  options.repository.control = server::ModelControl::kExplicit;
  const int64_t limit = server::EstimateModelBytes(options.repository.path + "/small") * 3 / 2;
  options.repository.max_model_bytes = limit;
  ASSERT_TRUE(Start(options));
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetMaxReceiveMessageSize(-1);
  auto stub = GRPCInferenceService::NewStub(grpc::CreateCustomChannel(
      testing::Target(*server_), grpc::InsecureChannelCredentials(), args));
  std::mt19937 rng(13);
  ModelInferRequest request = Request(RandomTensor({1, 1024, 16}, rng), "unread");
  (*request.mutable_parameters())["need_weights"].set_bool_param(true);
  (*request.mutable_parameters())["average_attn_weights"].set_bool_param(false);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto rpc = stub->AsyncModelInfer(&context, request, &cq);
  rpc->ReadInitialMetadata(reinterpret_cast<void*>(2));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  ASSERT_TRUE(WaitFor([&] { return Answered(absl::StatusCode::kOk) == 1; }));
  EXPECT_GT(server_->service().inflight_bytes(), 8 << 20) << "the unread response's admission";
  const absl::Status unloaded = server_->repository()->UnloadModel("small");
  ASSERT_TRUE(unloaded.ok()) << unloaded;
  EXPECT_TRUE(
      WaitFor([&] { return server_->repository()->resident_bytes() == 0; }, absl::Seconds(3)))
      << server_->repository()->resident_bytes();
  ModelInferResponse response;
  grpc::Status status;
  rpc->Finish(&response, &status, reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.model_version(), "1");
  EXPECT_TRUE(server_->Drain());
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(AsyncModelInferProbeTest, AFullQueueRefusesAndIsCountedOnce) {
  server::ServerOptions options = OneRequestBatches("rev_oip_queue_full");
  options.repository.batching.max_queue_size = 1;
  ASSERT_TRUE(Start(options));
  std::mt19937 rng(14);
  auto held = std::make_unique<PendingCall>(SmallRequest(rng, 3, "held"));
  auto queued = std::make_unique<PendingCall>(SmallRequest(rng, 3, "queued"));
  grpc::Status refused;
  std::string pushback;
  {
    absl::MutexLock hold(server_->repository()->compute_mutex());
    held->Start(stub_.get());
    ASSERT_TRUE(
        WaitFor([&] { return QueueDepth(*server_) == 0 && !held->done.HasBeenNotified(); }));
    ASSERT_TRUE(WaitFor([&] { return server_->metrics().inflight_requests().Value() == 1; }));
    queued->Start(stub_.get());
    ASSERT_TRUE(WaitFor([&] { return QueueDepth(*server_) == 1; }));
    grpc::ClientContext context;
    ModelInferResponse response;
    refused = Call(oip_.get(), Request(RandomTensor({1, 3, 16}, rng), "full"), &response, &context);
    const auto& trailers = context.GetServerTrailingMetadata();
    auto it = trailers.find("grpc-retry-pushback-ms");
    if (it != trailers.end()) pushback = std::string(it->second.data(), it->second.size());
  }
  held->done.WaitForNotification();
  queued->done.WaitForNotification();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("queue is full"), std::string::npos)
      << refused.error_message();
  // One tenant's full queue carries no retry hint (as on the callback path):
  // no trailer either.
  EXPECT_TRUE(pushback.empty()) << pushback;
  EXPECT_EQ(Answered(absl::StatusCode::kResourceExhausted), 1);
  EXPECT_TRUE(WaitFor([&] { return server_->metrics().inflight_requests().Value() == 0; }));
  EXPECT_TRUE(server_->Drain());
}

// A drain past its timeout, with one step of a sequence held by the batcher
// (the compute lock) and the next waiting in its session's queue (where no
// batcher polls its cancellation): the shutdown cancels both calls, the
// drain ends, and nothing stays in flight.
TEST_F(AsyncModelInferProbeTest, DrainTimeoutWithASequenceStepWaitingBehindAnotherEnds) {
  server::ServerOptions options = OneRequestBatches("rev_oip_seq_drain");
  options.drain_timeout = absl::Milliseconds(300);
  ASSERT_TRUE(Start(options));
  std::mt19937 rng(15);
  ModelInferRequest first = Request(RandomTensor({1, 3, 16}, rng), "first");
  Step(&first, 5, /*start=*/true, /*end=*/false);
  ModelInferResponse response;
  ASSERT_TRUE(Call(oip_.get(), first, &response).ok());
  ModelInferRequest a = Request(RandomTensor({1, 2, 16}, rng), "held");
  ModelInferRequest b = Request(RandomTensor({1, 2, 16}, rng), "waiting");
  Step(&a, 5, false, false);
  Step(&b, 5, false, false);
  PendingModelInfer held(a), waiting(b);
  absl::Notification drained;
  bool idle = true;
  std::thread drain;
  {
    absl::MutexLock hold(server_->repository()->compute_mutex());
    held.Start(oip_.get());
    ASSERT_TRUE(WaitFor([&] { return server_->metrics().inflight_requests().Value() == 1; }));
    ASSERT_TRUE(WaitFor([&] { return QueueDepth(*server_) == 0; }));
    waiting.Start(oip_.get());
    ASSERT_TRUE(WaitFor([&] { return server_->metrics().inflight_requests().Value() == 2; }));
    drain = std::thread([&] {
      idle = server_->Drain();
      drained.Notify();
    });
    // The shutdown (after the drain timeout) cuts the calls still open.
    ASSERT_TRUE(waiting.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    ASSERT_TRUE(held.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  ASSERT_TRUE(drained.WaitForNotificationWithTimeout(absl::Seconds(60))) << "Drain hangs";
  drain.join();
  EXPECT_FALSE(idle);
  EXPECT_FALSE(waiting.status.ok());
  EXPECT_EQ(server_->metrics().inflight_requests().Value(), 0);
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
}

// A ModelInfer whose deadline passes while it is queued is answered
// DEADLINE_EXCEEDED without being computed, and counted once.
TEST_F(AsyncModelInferProbeTest, DeadlineWhileQueuedIsAnsweredWithoutCompute) {
  ASSERT_TRUE(Start(OneRequestBatches("rev_oip_deadline")));
  std::mt19937 rng(16);
  const auto& m = *server_->repository()->Find("small")->metrics;
  PendingModelInfer first(Request(RandomTensor({1, 4, 16}, rng), "first"));
  PendingModelInfer late(Request(RandomTensor({1, 4, 16}, rng), "late"));
  double tokens_before = 0;
  {
    absl::MutexLock hold(server_->repository()->compute_mutex());
    first.Start(oip_.get());
    ASSERT_TRUE(WaitFor([&] { return server_->metrics().inflight_requests().Value() == 1; }));
    ASSERT_TRUE(WaitFor([&] { return QueueDepth(*server_) == 0; }));
    tokens_before = m.tokens->Value();
    late.context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    late.Start(oip_.get());
    // The client's deadline ends its call; the batcher, busy with `first`,
    // drops `late` once it is free.
    ASSERT_TRUE(late.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  ASSERT_TRUE(first.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(WaitFor([&] { return Answered(absl::StatusCode::kDeadlineExceeded) == 1; }));
  EXPECT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(m.tokens->Value(), tokens_before + 4);  // Only `first` computed.
  EXPECT_TRUE(WaitFor([&] { return server_->metrics().inflight_requests().Value() == 0; }));
  EXPECT_TRUE(server_->Drain());
}

// Many clients at once, for the sanitizers: stateless calls inline and on
// the parse pool, sequence steps, calls cancelled at once or cut by a short
// deadline, then a drain. Every call ends, nothing stays in flight.
TEST_F(AsyncModelInferProbeTest, ConcurrentMixedCallsWithCancellationsAllEnd) {
  server::ServerOptions options = SmallServerOptions("rev_oip_stress");
  options.infer_parse_threads = 2;
  ASSERT_TRUE(Start(options));
  constexpr int kClients = 6, kCalls = 24;
  std::vector<std::thread> clients;
  std::atomic<int> unexpected{0};
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(100 + c);
      const Tensor small = RandomTensor({1, 4, 16}, rng);
      const Tensor large = RandomTensor({80, 64, 16}, rng);
      for (int i = 0; i < kCalls; ++i) {
        const int kind = static_cast<int>(rng() % 5);
        ModelInferRequest r = Request(kind == 1 ? large : small, absl::StrCat(c, "-", i));
        if (kind == 2) Step(&r, 1000 + c, /*start=*/i % 6 == 0, /*end=*/false);
        auto call = std::make_unique<PendingModelInfer>(std::move(r));
        if (kind == 4) {
          call->context.set_deadline(std::chrono::system_clock::now() +
                                     std::chrono::microseconds(rng() % 3000));
        }
        call->Start(oip_.get());
        if (kind == 3) call->context.TryCancel();
        if (!call->done.WaitForNotificationWithTimeout(absl::Seconds(30))) {
          ++unexpected;
          std::abort();  // The call still holds the context.
        }
        const grpc::StatusCode code = call->status.error_code();
        const bool ok = code == grpc::StatusCode::OK ||
                        (kind == 2 && code == grpc::StatusCode::NOT_FOUND) ||
                        (kind == 3 && code == grpc::StatusCode::CANCELLED) ||
                        (kind == 4 && code == grpc::StatusCode::DEADLINE_EXCEEDED);
        if (!ok) {
          ++unexpected;
          ADD_FAILURE() << "kind " << kind << ": " << code << " " << call->status.error_message();
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_TRUE(WaitFor([&] { return server_->metrics().inflight_requests().Value() == 0; }))
      << server_->metrics().inflight_requests().Value();
  EXPECT_TRUE(server_->Drain());
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
}

}  // namespace
}  // namespace attention
