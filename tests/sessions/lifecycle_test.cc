// Sessions across a server's life: eviction under memory pressure (and not
// before the grace), a drain with an append queued, a second server on a
// port in use, and the limits of a session's life a caller may trip on (its
// TTL, its id, a cross session's queries).
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "absl/synchronization/mutex.h"

#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/session_test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

// SIGTERM-style drain: an append already queued completes, new appends and
// sessions are refused UNAVAILABLE, and Drain reports every request answered.
TEST(SessionDrainTest, QueuedAppendsFinishAndNewOnesAreRefused) {
  AttentionServer* server = StartServer("session_drain", 16 << 20, absl::Hours(1));
  auto stub = v1::SessionService::NewStub(server->InProcessChannel());
  std::mt19937 rng(17);
  v1::SessionInfo info;
  {
    grpc::ClientContext context;
    v1::CreateSessionRequest request;
    request.set_kind(v1::SESSION_KIND_SELF);
    ASSERT_TRUE(stub->CreateSession(&context, request, &info).ok());
  }
  grpc::Status queued;
  bool drained = false;
  std::thread append, drain;
  {
    absl::MutexLock hold(server->repository()->compute_mutex());
    // The tokens are drawn here: `rng` is used again below while this thread
    // may still run.
    const Tensor tokens = RandomTensor({4, kE}, rng);
    append = std::thread([&] {
      grpc::ClientContext context;
      v1::AppendRequest request;
      request.set_session_id(info.session_id());
      ToProto(tokens, request.mutable_tokens());
      v1::AppendResponse response;
      queued = stub->Append(&context, request, &response);
    });
    // Wait (bounded) until the append is queued, then start draining.
    for (int i = 0; i < 500 && server->metrics().inflight_requests().Value() < 1; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_GE(server->metrics().inflight_requests().Value(), 1);
    drain = std::thread([&] { drained = server->Drain(); });
    for (int i = 0; i < 500 && !server->service().draining(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    grpc::ClientContext context;
    v1::AppendRequest request;
    request.set_session_id(info.session_id());
    ToProto(RandomTensor({1, kE}, rng), request.mutable_tokens());
    v1::AppendResponse response;
    const grpc::Status refused = stub->Append(&context, request, &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  append.join();
  drain.join();
  EXPECT_TRUE(queued.ok()) << queued.error_message();
  EXPECT_TRUE(drained);
  delete server;
}

// A second server on a port in use fails to start instead of sharing it
// (gRPC's default SO_REUSEPORT would split the clients, and their sessions,
// between the two).
TEST(ServerPortTest, ASecondServerOnTheSamePortFailsToStart) {
  server::ServerOptions options;
  options.host = "127.0.0.1";
  options.port = testing::FreePort();
  options.metrics_port = 0;
  auto first = AttentionServer::Listen(options);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = AttentionServer::Listen(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("cannot listen"));
}

// A 1 MiB budget: one slab of 256 blocks of 4 KiB ("small" in float32: 16
// tokens x K and V x 32 features x 4 bytes), i.e. 64 sessions of 64 tokens.
TEST(SessionEvictionTest, IdleSessionsAreEvictedOnlyAfterTheGrace) {
  for (const bool evictable : {true, false}) {
    AttentionServer* server = StartServer(evictable ? "evict_now" : "evict_never", 1 << 20,
                                          evictable ? absl::ZeroDuration() : absl::Hours(1));
    auto stub = v1::SessionService::NewStub(server->InProcessChannel());
    std::mt19937 rng(14);
    std::vector<std::string> ids;
    grpc::Status status;
    // 64-token sessions until the budget is full.
    for (int i = 0; i < 80 && status.ok(); ++i) {
      grpc::ClientContext context;
      v1::CreateSessionRequest request;
      request.set_kind(v1::SESSION_KIND_SELF);
      v1::SessionInfo info;
      ASSERT_TRUE(stub->CreateSession(&context, request, &info).ok());
      grpc::ClientContext append_context;
      v1::AppendRequest append;
      append.set_session_id(info.session_id());
      ToProto(RandomTensor({64, kE}, rng), append.mutable_tokens());
      v1::AppendResponse response;
      status = stub->Append(&append_context, append, &response);
      ids.push_back(info.session_id());
    }
    if (evictable) {
      // Every append found room by evicting the oldest idle session.
      EXPECT_TRUE(status.ok()) << status.error_message();
      grpc::ClientContext context;
      v1::GetSessionRequest get;
      get.set_session_id(ids.front());
      v1::SessionInfo info;
      const grpc::Status first = stub->GetSession(&context, get, &info);
      EXPECT_EQ(first.error_code(), grpc::StatusCode::NOT_FOUND);
      EXPECT_THAT(first.error_message(), HasSubstr("evicted"));
    } else {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      EXPECT_THAT(status.error_message(), HasSubstr("no session may be evicted for them"));
      // The sessions that fit are intact.
      grpc::ClientContext context;
      v1::GetSessionRequest get;
      get.set_session_id(ids.front());
      v1::SessionInfo info;
      EXPECT_TRUE(stub->GetSession(&context, get, &info).ok());
      EXPECT_EQ(info.length(), 64);
    }
    EXPECT_LE(server->metrics().session_memory_bytes().Value(), 1 << 20);
    EXPECT_TRUE(server->Drain());
    delete server;
  }
}

// Issue 21 item 8: a TTL above --max_session_ttl_s (1 day by default) is
// refused, not clamped; an empty session_id is a bad argument, not a
// session of another replica; a cross session's max_session_tokens refusal
// says that it caps queries and how many keys the session holds.
TEST(SessionArgumentsTest, TtlIdAndCrossQueryLimitsAreNamed) {
  AttentionServer* server = StartServer("session_arguments", 16 << 20, absl::Hours(1));
  auto stub = v1::SessionService::NewStub(server->InProcessChannel());
  for (const int64_t ttl_s : {int64_t{86401}, std::numeric_limits<int64_t>::max()}) {
    grpc::ClientContext context;
    v1::CreateSessionRequest request;
    request.set_kind(v1::SESSION_KIND_SELF);
    request.set_ttl_s(ttl_s);
    v1::SessionInfo info;
    const grpc::Status status = stub->CreateSession(&context, request, &info);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << ttl_s;
    EXPECT_THAT(status.error_message(),
                HasSubstr("ttl_s: expected 0 (the model's default) to 86400 (the server's "
                          "--max_session_ttl_s), got"));
  }
  {
    grpc::ClientContext context;
    v1::CreateSessionRequest request;
    request.set_kind(v1::SESSION_KIND_SELF);
    request.set_ttl_s(86400);
    v1::SessionInfo info;
    ASSERT_TRUE(stub->CreateSession(&context, request, &info).ok());
    EXPECT_EQ(info.ttl_s(), 86400);
  }
  std::mt19937 rng(21);
  {
    grpc::ClientContext append_context, get_context, close_context;
    v1::AppendRequest append;
    ToProto(RandomTensor({1, kE}, rng), append.mutable_tokens());
    v1::AppendResponse appended;
    v1::SessionInfo info;
    v1::CloseSessionResponse closed;
    for (const grpc::Status& status :
         {stub->Append(&append_context, append, &appended),
          stub->GetSession(&get_context, v1::GetSessionRequest(), &info),
          stub->CloseSession(&close_context, v1::CloseSessionRequest(), &closed)}) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_THAT(status.error_message(), HasSubstr("session_id: required"));
    }
  }
  // "small" as a cross session: 9 keys; 41 queries, then 41 more pass its
  // max_session_tokens 64.
  v1::SessionInfo cross;
  {
    grpc::ClientContext context;
    v1::CreateSessionRequest request;
    request.set_kind(v1::SESSION_KIND_CROSS);
    ToProto(RandomTensor({9, kE}, rng), request.mutable_key());
    ASSERT_TRUE(stub->CreateSession(&context, request, &cross).ok());
  }
  auto append_41 = [&] {
    grpc::ClientContext context;
    v1::AppendRequest append;
    append.set_session_id(cross.session_id());
    ToProto(RandomTensor({41, kE}, rng), append.mutable_tokens());
    v1::AppendResponse response;
    return stub->Append(&context, append, &response);
  };
  grpc::Status status = append_41();
  ASSERT_TRUE(status.ok()) << status.error_message();
  status = append_41();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              HasSubstr("this cross session has been sent 41 queries; 41 more would pass the "
                        "model's max_session_tokens 64"));
  EXPECT_THAT(status.error_message(), HasSubstr("it holds 9 keys"));
  EXPECT_TRUE(server->Drain());
  delete server;
}

}  // namespace
}  // namespace attention
