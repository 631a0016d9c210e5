// The batching guarantees: a request's result equals its solo result
// whatever it was batched with; a full queue refuses at once; expired and
// cancelled requests are answered without being computed.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/fixture/server_fixture.h"

namespace attention {
namespace {

using ::testing::HasSubstr;

TEST_F(ServerTest, BatchedResultsEqualSoloResults) {
  // Many concurrent requests of mixed lengths, masks and options: each
  // response must equal the request run alone, whatever it was batched with.
  constexpr int kThreads = 8, kPerThread = 12;
  std::vector<std::thread> threads;
  std::atomic<int> shared_batches{0}, mismatches{0}, failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto stub = LoopbackStub();
      std::mt19937 rng(100 + t);
      for (int i = 0; i < kPerThread; ++i) {
        RequestCase c = MakeCase(rng, t * kPerThread + i);
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        v1::InferResponse response;
        if (!stub->Infer(&ctx, c.request, &response).ok()) {
          ++failures;
          continue;
        }
        if (response.batch_requests() > 1) ++shared_batches;
        MhaOutputs solo = Solo(Engine("small"), c);
        Tensor got = FromProto(response.output());
        for (int64_t j = 0; j < got.num_elements(); ++j) {
          if (std::abs(got.as<float>()[j] - solo.output.as<float>()[j]) > 1e-6) {
            ++mismatches;
            break;
          }
        }
        if (c.request.need_weights()) {
          Tensor w = FromProto(response.attn_weights());
          for (int64_t j = 0; j < w.num_elements(); ++j) {
            if (std::abs(w.as<float>()[j] - solo.attn_weights->as<float>()[j]) > 1e-6) {
              ++mismatches;
              break;
            }
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_GT(shared_batches.load(), 0) << "no request was ever batched with another";
}

// Sends `request` asynchronously; `done` is notified with the status.
struct AsyncCall {
  grpc::ClientContext ctx;
  v1::InferResponse response;
  grpc::Status status;
  absl::Notification done;
  void Start(v1::AttentionService::Stub* stub, const v1::InferRequest& request) {
    stub->async()->Infer(&ctx, &request, &response, [this](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
  }
};

// Waits (bounded) until `model`'s queue holds `depth` requests.
bool WaitForQueueDepth(server::ModelRepository* repo, const std::string& model, int64_t depth) {
  for (int i = 0; i < 2000; ++i) {
    if (repo->Find(model)->batcher->queue_depth() == depth) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

v1::InferRequest TinyRequest() {
  v1::InferRequest r;
  r.set_model("tiny_queue");
  Tensor q(DType::kFloat32, {1, 3, 16});
  ToProto(q, r.mutable_query());
  return r;
}

TEST_F(ServerTest, FullQueueAnswersResourceExhaustedAtOnce) {
  auto stub = InProcessStub();
  server::ModelRepository* repo = server_->repository();
  const v1::InferRequest request = TinyRequest();
  AsyncCall a, b, c;
  {
    absl::MutexLock hold(repo->compute_mutex());  // No batch can compute.
    a.Start(stub.get(), request);
    ASSERT_TRUE(WaitForQueueDepth(repo, "tiny_queue", 0));  // A is taken, waiting to compute.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    b.Start(stub.get(), request);
    c.Start(stub.get(), request);
    ASSERT_TRUE(WaitForQueueDepth(repo, "tiny_queue", 2));
    grpc::ClientContext ctx;
    v1::InferResponse response;
    const grpc::Status full = stub->Infer(&ctx, request, &response);
    EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(full.error_message(), HasSubstr("queue is full: 2 requests waiting"));
  }
  for (AsyncCall* call : {&a, &b, &c}) {
    call->done.WaitForNotification();
    EXPECT_TRUE(call->status.ok()) << call->status.error_message();
  }
}

TEST_F(ServerTest, ExpiredAndCancelledRequestsAreNeverComputed) {
  auto stub = InProcessStub();
  server::ModelRepository* repo = server_->repository();
  const server::ModelMetrics& m = ModelMetricsOf("tiny_queue");
  const double deadline_before = Count(m, absl::StatusCode::kDeadlineExceeded);
  const double cancelled_before = Count(m, absl::StatusCode::kCancelled);
  const v1::InferRequest request = TinyRequest();
  AsyncCall first, expiring, cancelled;
  double tokens_before;
  {
    absl::MutexLock hold(repo->compute_mutex());
    first.Start(stub.get(), request);
    ASSERT_TRUE(WaitForQueueDepth(repo, "tiny_queue", 0));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    tokens_before = m.tokens->Value();
    expiring.ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(50));
    expiring.Start(stub.get(), request);
    cancelled.Start(stub.get(), request);
    ASSERT_TRUE(WaitForQueueDepth(repo, "tiny_queue", 2));
    cancelled.ctx.TryCancel();
    expiring.done.WaitForNotification();  // The client sees its deadline pass.
    cancelled.done.WaitForNotification();
  }
  first.done.WaitForNotification();
  EXPECT_TRUE(first.status.ok());
  EXPECT_EQ(expiring.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(cancelled.status.error_code(), grpc::StatusCode::CANCELLED);
  // The server answers both without computing them: only the first's tokens count.
  for (int i = 0; i < 2000 && (Count(m, absl::StatusCode::kDeadlineExceeded) == deadline_before ||
                               Count(m, absl::StatusCode::kCancelled) == cancelled_before);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(Count(m, absl::StatusCode::kDeadlineExceeded), deadline_before + 1);
  EXPECT_EQ(Count(m, absl::StatusCode::kCancelled), cancelled_before + 1);
  EXPECT_EQ(m.tokens->Value(), tokens_before + 3);
  EXPECT_TRUE(WaitForQueueDepth(repo, "tiny_queue", 0));
}

}  // namespace
}  // namespace attention
