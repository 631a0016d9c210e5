// Tenants end to end: one token floods a model's queue, another sends a
// modest request over each protocol that queues (attention.v1 Infer, REST
// infer, session appends); the modest one is never refused while the
// flooder is, and a token's rate= limit answers RESOURCE_EXHAUSTED with a
// retry hint. Deterministic: the model's compute is held (its mutex) while
// the queue fills, and every wait is on a condition.
#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/notification.h"
#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/attention_server.h"
#include "tests/fixture/http_test_client.h"
#include "tests/fixture/oip_requests.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"
#include "tests/fixture/token_files.h"

namespace attention {
namespace {

using ::attention::server::AttentionServer;
using ::attention::server::ServerOptions;
using ::attention::server::TenantRefusal;
using ::testing::HasSubstr;
using json = nlohmann::json;

std::string Dir() { return ::testing::TempDir() + "/tenants_test_" + std::to_string(getpid()); }

// Polls `probe` (every millisecond, at most 10 s).
bool Eventually(const std::function<bool()>& probe) {
  for (int i = 0; i < 10000; ++i) {
    if (probe()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return probe();
}

// A REST infer body: one (1, 2, 16) query of the model "small".
std::string RestInferBody() {
  return json{{"inputs",
               {{{"name", "query"},
                 {"datatype", "FP32"},
                 {"shape", {1, 2, 16}},
                 {"data", std::vector<float>(32, 0.5f)}}}}}
      .dump();
}

// An Infer sent asynchronously with a token.
struct AsyncInfer {
  grpc::ClientContext ctx;
  v1::InferRequest request;
  v1::InferResponse response;
  grpc::Status status;
  absl::Notification done;
  void Start(v1::AttentionService::Stub* stub, const std::string& token) {
    ctx.AddMetadata("authorization", "Bearer " + token);
    std::mt19937 rng(1);
    request.set_model("small");
    testing::ToProto(testing::RandomTensor({1, 3, 16}, rng), request.mutable_query());
    stub->async()->Infer(&ctx, &request, &response, [this](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
  }
};

class TenantsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StartWith([](ServerOptions&) {});
  }
  // (Re)starts the server with the fixture's options and then `tweak`.
  void StartWith(const std::function<void(ServerOptions&)>& tweak) {
    stub_.reset();
    if (server_ != nullptr) server_->Drain();
    server_.reset();
    std::filesystem::remove_all(Dir());
    const std::string models = Dir() + "/models";
    testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(16, 2), 1),
                           models + "/small");
    const std::string tokens = Dir() + "/tokens";
    {
      std::ofstream out(tokens);
      out << testing::HashHex("a-secret") << " alice *\n"
          << testing::HashHex("b-secret") << " bob *\n"
          << testing::HashHex("r-secret")
          << " rater * rate=2\n"
          // One request, then one each 1000 s: over its rate after one.
          << testing::HashHex("s-secret") << " slow * rate=0.001\n";
    }
    ServerOptions o = testing::TestServerOptions(models, /*rest=*/true);
    o.drain_grace = absl::Milliseconds(500);
    o.auth_tokens_file = tokens;
    o.repository.batching.max_batch_size = 1;
    o.repository.batching.max_queue_size = 4;
    tweak(o);
    server_ = testing::StartServer(o);
    ASSERT_NE(server_, nullptr);
    stub_ = v1::AttentionService::NewStub(testing::PlainChannel(*server_));
  }
  void TearDown() override {
    stub_.reset();
    if (server_ != nullptr) server_->Drain();
    server_.reset();
    std::filesystem::remove_all(Dir());
  }

  server::DynamicBatcher* Batcher() { return server_->repository()->Find("small")->batcher.get(); }
  const server::TenantSeries* Series(const std::string& name) {
    return server_->repository()->Find("small")->metrics->tenants->For(name);
  }
  static double Refusals(const server::TenantSeries* s, TenantRefusal why) {
    return s->refusals[static_cast<int>(why)]->Value();
  }
  grpc::Status Infer(const std::string& token) {
    AsyncInfer call;
    call.Start(stub_.get(), token);
    call.done.WaitForNotification();
    return call.status;
  }

  // With the compute held: alice's first request taken by the batcher
  // (waiting to compute), then four more filling the queue.
  void FloodAsAlice(std::vector<std::unique_ptr<AsyncInfer>>* calls) {
    calls->push_back(std::make_unique<AsyncInfer>());
    calls->back()->Start(stub_.get(), "a-secret");
    ASSERT_TRUE(Eventually([&] {
      return server_->metrics().inflight_requests().Value() == 1 && Batcher()->queue_depth() == 0;
    }));
    for (int i = 0; i < 4; ++i) {
      calls->push_back(std::make_unique<AsyncInfer>());
      calls->back()->Start(stub_.get(), "a-secret");
    }
    ASSERT_TRUE(Eventually([&] { return Batcher()->queue_depth() == 4; }));
  }

  std::unique_ptr<AttentionServer> server_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
};

TEST_F(TenantsTest, AFloodingTokenIsRefusedAndAModestOneNever) {
  std::vector<std::unique_ptr<AsyncInfer>> alice;
  std::vector<std::unique_ptr<AsyncInfer>> bob;
  {
    absl::MutexLock hold(server_->repository()->compute_mutex());
    FloodAsAlice(&alice);
    const grpc::Status full = Infer("a-secret");
    EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(full.error_message(),
              "queue is full: 4 requests waiting (max_queue_size 4: the model's config.json "
              "max_queue_size, else the server's --max_queue_size); retry later");
    // bob's share is 2 of the 4: each of his pushes out alice's newest.
    for (int i = 0; i < 2; ++i) {
      bob.push_back(std::make_unique<AsyncInfer>());
      bob.back()->Start(stub_.get(), "b-secret");
    }
    ASSERT_TRUE(
        Eventually([&] { return Refusals(Series("alice"), TenantRefusal::kPushedOut) == 2; }));
    const grpc::Status over = Infer("b-secret");
    EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(over.error_message(), HasSubstr("this caller has 2 of them, its share is 2"));
  }
  for (auto& call : bob) {
    call->done.WaitForNotification();
    EXPECT_TRUE(call->status.ok()) << call->status.error_message();
  }
  int ok = 0, pushed_out = 0;
  for (auto& call : alice) {
    call->done.WaitForNotification();
    if (call->status.ok()) ++ok;
    if (call->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
        absl::StrContains(call->status.error_message(),
                          "pushed out for a caller under its share")) {
      ++pushed_out;
    }
  }
  EXPECT_EQ(ok, 3);
  EXPECT_EQ(pushed_out, 2);
  EXPECT_EQ(Refusals(Series("alice"), TenantRefusal::kQueueShare), 1);
  EXPECT_EQ(Refusals(Series("bob"), TenantRefusal::kQueueShare), 1);
  EXPECT_EQ(Refusals(Series("bob"), TenantRefusal::kPushedOut), 0);
  EXPECT_EQ(Series("alice")->queue_depth->Value(), 0);
  EXPECT_GT(Series("bob")->flops->Value(), 0);
}

TEST_F(TenantsTest, AModestRestRequestAndAppendGetInWhileTheQueueIsFull) {
  std::vector<std::unique_ptr<AsyncInfer>> alice;
  testing::HttpTestClient http("127.0.0.1", server_->http_port());
  const std::string body = RestInferBody();
  testing::HttpTestResult rest(absl::UnknownError("not sent"));
  auto sessions = v1::SessionService::NewStub(testing::PlainChannel(*server_));
  grpc::Status append;
  std::thread rest_call, append_call;
  {
    absl::MutexLock hold(server_->repository()->compute_mutex());
    FloodAsAlice(&alice);
    rest_call = std::thread([&] {
      rest = http.Post("/v2/models/small/infer", {{"Authorization", "Bearer b-secret"}}, body,
                       "application/json");
    });
    append_call = std::thread([&] {
      grpc::ClientContext create;
      create.AddMetadata("authorization", "Bearer b-secret");
      v1::CreateSessionRequest request;
      request.set_model("small");
      request.set_kind(v1::SESSION_KIND_SELF);
      v1::SessionInfo info;
      append = sessions->CreateSession(&create, request, &info);
      if (!append.ok()) return;
      grpc::ClientContext context;
      context.AddMetadata("authorization", "Bearer b-secret");
      v1::AppendRequest step;
      step.set_session_id(info.session_id());
      std::mt19937 rng(2);
      testing::ToProto(testing::RandomTensor({2, 16}, rng), step.mutable_tokens());
      v1::AppendResponse response;
      append = sessions->Append(&context, step, &response);
    });
    // Both of bob's got in, each pushing out one of alice's.
    ASSERT_TRUE(
        Eventually([&] { return Refusals(Series("alice"), TenantRefusal::kPushedOut) == 2; }));
    EXPECT_EQ(Refusals(Series("bob"), TenantRefusal::kQueueShare), 0);
  }  // Released: everything queued computes.
  rest_call.join();
  append_call.join();
  ASSERT_TRUE(rest) << rest.error();
  EXPECT_EQ(rest->status, 200) << rest->body;
  EXPECT_TRUE(append.ok()) << append.error_message();
  for (auto& call : alice) call->done.WaitForNotification();
}

TEST_F(TenantsTest, ARateLimitedTokenGetsARetryHint) {
  EXPECT_TRUE(Infer("r-secret").ok());
  EXPECT_TRUE(Infer("r-secret").ok());
  const grpc::Status third = Infer("r-secret");
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.error_message(),
              HasSubstr("rate: caller 'rater' is over its rate of 2 requests/s"));
  EXPECT_THAT(third.error_message(), HasSubstr("retry after"));
  // Another token is not limited by it.
  EXPECT_TRUE(Infer("b-secret").ok());
  // Over the inference protocol too, where the hint is also a trailer.
  auto oip = inference::GRPCInferenceService::NewStub(testing::PlainChannel(*server_));
  const std::vector<float> data(32, 0.5f);
  const inference::ModelInferRequest request =
      testing::Fp32InferRequest("small", "query", {1, 2, 16}, data.data());
  grpc::Status refused;
  std::string pushback;
  for (int i = 0; i < 3 && refused.ok(); ++i) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer r-secret");
    inference::ModelInferResponse response;
    refused = oip->ModelInfer(&context, request, &response);
    const auto& trailers = context.GetServerTrailingMetadata();
    auto it = trailers.find("grpc-retry-pushback-ms");
    if (it != trailers.end()) pushback = std::string(it->second.data(), it->second.size());
  }
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("rate: caller 'rater'"));
  int64_t ms = 0;
  ASSERT_TRUE(absl::SimpleAtoi(pushback, &ms)) << "trailer: '" << pushback << "'";
  EXPECT_GT(ms, 0);
  EXPECT_LE(ms, 1000);
  testing::HttpTestClient http("127.0.0.1", server_->http_port());
  const std::string body = RestInferBody();
  auto res = http.Post("/v2/models/small/infer", {{"Authorization", "Bearer r-secret"}}, body,
                       "application/json");
  ASSERT_TRUE(res) << res.error();
  EXPECT_EQ(res->status, 429) << res->body;
  EXPECT_EQ(res->Header("Retry-After"), "1");
  EXPECT_GE(Refusals(Series("rater"), TenantRefusal::kRate), 2);
}

// attention.v1 Infer (the async path) carries the retry hint as a trailer
// too, as ModelInfer, Append and CreateSession do.
TEST_F(TenantsTest, AnInferOverTheRateCarriesTheRetryTrailer) {
  ASSERT_TRUE(Infer("s-secret").ok());  // The one request its rate allows.
  AsyncInfer call;
  call.Start(stub_.get(), "s-secret");
  call.done.WaitForNotification();
  EXPECT_EQ(call.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  const auto& trailers = call.ctx.GetServerTrailingMetadata();
  EXPECT_NE(trailers.find("grpc-retry-pushback-ms"), trailers.end());
}

// A cross session's creation queues (its keys are projected on the
// batcher), so it is rated; refused over the rate, it must change nothing:
// creating first would have evicted the caller's own idle session to make
// room under max_sessions_per_tenant.
TEST_F(TenantsTest, ACrossSessionOverTheRateEvictsNothing) {
  StartWith([](ServerOptions& o) {
    o.sessions.max_sessions_per_tenant = 1;
    o.sessions.evict_grace = absl::ZeroDuration();
  });
  auto sessions = v1::SessionService::NewStub(testing::PlainChannel(*server_));
  v1::SessionInfo held;
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer s-secret");
    v1::CreateSessionRequest request;
    request.set_model("small");
    request.set_kind(v1::SESSION_KIND_SELF);
    const grpc::Status created = sessions->CreateSession(&context, request, &held);
    ASSERT_TRUE(created.ok()) << created.error_message();  // Not queued: not rated.
  }
  ASSERT_TRUE(Infer("s-secret").ok());  // The one request its rate allows.
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer s-secret");
    v1::CreateSessionRequest request;
    request.set_model("small");
    request.set_kind(v1::SESSION_KIND_CROSS);
    std::mt19937 rng(3);
    testing::ToProto(testing::RandomTensor({5, 16}, rng), request.mutable_key());
    v1::SessionInfo info;
    const grpc::Status refused = sessions->CreateSession(&context, request, &info);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(refused.error_message(), HasSubstr("rate: caller 'slow'"));
    const auto& trailers = context.GetServerTrailingMetadata();
    EXPECT_NE(trailers.find("grpc-retry-pushback-ms"), trailers.end());
  }
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer s-secret");
  v1::GetSessionRequest get;
  get.set_session_id(held.session_id());
  v1::SessionInfo info;
  const grpc::Status still = sessions->GetSession(&context, get, &info);
  EXPECT_TRUE(still.ok()) << still.error_message();
  EXPECT_EQ(
      server_->repository()
          ->Find("small")
          ->metrics->session_ends[static_cast<int>(server::SessionEnd::kEvictedTenantSessions)]
          ->Value(),
      0);
}

}  // namespace
}  // namespace attention
