// Sessions shared between tenants (callers with different tokens): one
// tenant's flood neither evicts another's sessions nor takes every slot,
// refusals name the limit, memory eviction spares a tenant within its fair
// share, ownership follows the token and not its name, and without tokens the
// one tenant keeps today's limits. In-process servers, two small models.
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <functional>
#include <iostream>
#include <random>

#include "attention/v1/sessions.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "tests/fixture/oip_requests.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"
#include "tests/fixture/token_files.h"

namespace attention {
namespace {

using ::attention::server::ServerOptions;
using ::attention::server::SessionEnd;
using ::attention::testing::HashHex;
using ::testing::HasSubstr;

constexpr int64_t kE = 16;  // "small": E=16, H=2, float32: 2048-byte cache blocks of 16 tokens.

// Two tokens whose entries share the name "team": A and B are two tenants.
constexpr char kTokenA[] = "team-a-secret";
constexpr char kTokenB[] = "team-b-secret";

// A server on a repository of two models ("small", "other") with a 1 MiB
// session budget (one slab: 512 blocks), tokens A and B unless `tokens` is
// false, and `tweak` applied to its options.
std::unique_ptr<server::AttentionServer> StartServer(
    bool tokens, const std::function<void(ServerOptions&)>& tweak) {
  static const std::string repository = [] {
    testing::ModelFolder models("session_tenant_test");
    models.Add("small", testing::SelfAttentionSpec(kE, 2), 1);
    models.Add("other", testing::SelfAttentionSpec(kE, 2), 2);
    std::ofstream(models.path() + "_tokens") << HashHex(kTokenA) << " team small,other\n"
                                             << HashHex(kTokenB) << " team small,other\n";
    return models.path();
  }();
  ServerOptions options = testing::TestServerOptions(repository);
  options.drain_grace = absl::Milliseconds(500);
  options.repository.default_model = "small";
  options.sessions.memory_bytes = 1 << 20;
  if (tokens) options.auth_tokens_file = repository + "_tokens";
  tweak(options);
  return testing::StartServer(options);
}

// One caller: a token (empty: none) on a server's in-process channel.
class Caller {
 public:
  Caller(server::AttentionServer& server, std::string token)
      : stub_(v1::SessionService::NewStub(server.InProcessChannel())), token_(std::move(token)) {}

  // A self session of "small"; its id, or the refusal.
  grpc::Status Create(std::string* id) {
    grpc::ClientContext context;
    Authorize(context);
    v1::SessionInfo info;
    const grpc::Status status = testing::CreateSelfSession(*stub_, context, "small", &info);
    *id = info.session_id();
    return status;
  }
  grpc::Status Append(const std::string& id, int64_t tokens) {
    grpc::ClientContext context;
    Authorize(context);
    v1::AppendRequest request;
    request.set_session_id(id);
    testing::ToProto(testing::RandomTensor({tokens, kE}, rng_), request.mutable_tokens());
    v1::AppendResponse response;
    return stub_->Append(&context, request, &response);
  }
  grpc::Status Get(const std::string& id, v1::SessionInfo* info) {
    grpc::ClientContext context;
    Authorize(context);
    v1::GetSessionRequest request;
    request.set_session_id(id);
    return stub_->GetSession(&context, request, info);
  }
  grpc::Status Close(const std::string& id) {
    grpc::ClientContext context;
    Authorize(context);
    v1::CloseSessionRequest request;
    request.set_session_id(id);
    v1::CloseSessionResponse response;
    return stub_->CloseSession(&context, request, &response);
  }

 private:
  void Authorize(grpc::ClientContext& context) const {
    if (!token_.empty()) context.AddMetadata("authorization", "Bearer " + token_);
  }

  std::unique_ptr<v1::SessionService::Stub> stub_;
  const std::string token_;
  std::mt19937 rng_{5};
};

double Ends(server::AttentionServer& server, SessionEnd end) {
  return server.repository()->Find("small")->metrics->session_ends[static_cast<int>(end)]->Value();
}

// Item 5 of issue 21: a session belongs to the token that created it, not to
// the name its entry carries (two entries may share one).
TEST(SessionTenantTest, AnotherTokenWithTheSameNameDoesNotOwnTheSession) {
  auto server = StartServer(true, [](ServerOptions&) {});
  ASSERT_NE(server, nullptr);
  Caller a(*server, kTokenA), b(*server, kTokenB);
  std::string id;
  ASSERT_TRUE(a.Create(&id).ok());
  ASSERT_TRUE(a.Append(id, 3).ok());
  v1::SessionInfo info;
  for (const grpc::Status& status : {b.Append(id, 1), b.Get(id, &info), b.Close(id)}) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(status.error_message(), HasSubstr("belongs to another token"));
  }
  ASSERT_TRUE(a.Get(id, &info).ok());
  EXPECT_EQ(info.length(), 3) << "B's append must not have been applied";
  EXPECT_TRUE(a.Close(id).ok());
}

// Item 4: with every idle session evictable at once (grace 0), token B
// creates 200 sessions and appends 160 tokens to each. B may only evict its
// own sessions, so token A's two sessions (a quarter of max_sessions 8, the
// default per-tenant limit) survive, and B is never refused: it recycles its
// own. Before tenants, B's 7th session evicted A's.
TEST(SessionTenantTest, AnotherTenantsFloodDoesNotEvictASession) {
  auto server = StartServer(true, [](ServerOptions& o) {
    o.sessions.max_sessions = 8;
    o.sessions.evict_grace = absl::ZeroDuration();
  });
  ASSERT_NE(server, nullptr);
  Caller a(*server, kTokenA), b(*server, kTokenB);
  std::vector<std::string> mine(2);
  for (std::string& id : mine) {
    ASSERT_TRUE(a.Create(&id).ok());
    ASSERT_TRUE(a.Append(id, 16).ok());
  }
  int created = 0, appended = 0, refused = 0;
  std::string refusal;
  for (int i = 0; i < 200; ++i) {
    std::string id;
    grpc::Status status = b.Create(&id);
    if (status.ok()) {
      ++created;
      status = b.Append(id, 160);
      if (status.ok()) ++appended;
    }
    if (!status.ok()) {
      ++refused;
      refusal = status.error_message();
    }
  }
  int kept = 0;
  for (const std::string& id : mine) {
    v1::SessionInfo info;
    const grpc::Status status = a.Get(id, &info);
    if (status.ok() && info.length() == 16) ++kept;
  }
  std::cout << "fairness (max_sessions 8, grace 0): A kept " << kept
            << " of 2 sessions; B: " << created << " of 200 created, " << appended
            << " appends of 160 tokens OK, " << refused << " refused"
            << (refusal.empty() ? "" : " (last: " + refusal + ")")
            << "; evictions: tenant_sessions " << Ends(*server, SessionEnd::kEvictedTenantSessions)
            << ", model_sessions " << Ends(*server, SessionEnd::kEvictedModelSessions)
            << ", memory " << Ends(*server, SessionEnd::kEvictedMemory) << ", tenant_memory "
            << Ends(*server, SessionEnd::kEvictedTenantMemory) << "\n";
  EXPECT_EQ(kept, 2);
  EXPECT_EQ(created, 200);
  EXPECT_EQ(appended, 200);
  EXPECT_EQ(Ends(*server, SessionEnd::kEvictedTenantSessions), 198);
  // The ledger: B holds its last two sessions, 10 blocks of 2048 bytes each.
  const auto usage = server->sessions()->tenant_usage(HashHex(kTokenB));
  EXPECT_EQ(usage.sessions, 2);
  EXPECT_EQ(usage.bytes, 2 * 10 * 2048);
  for (const std::string& id : mine) EXPECT_TRUE(a.Close(id).ok());
  EXPECT_EQ(server->sessions()->tenant_usage(HashHex(kTokenA)).bytes, 0);
}

// Item 4: with no session idle long enough to evict, each refusal names the
// limit that was hit: the tenant's count, the model's count, the tenant's
// memory. The other tenant's sessions are untouched throughout.
TEST(SessionTenantTest, RefusalsNameTheLimit) {
  auto server = StartServer(true, [](ServerOptions& o) {
    o.sessions.max_sessions = 4;
    o.sessions.max_sessions_per_tenant = 3;
    o.sessions.evict_grace = absl::Hours(1);
  });
  ASSERT_NE(server, nullptr);
  Caller a(*server, kTokenA), b(*server, kTokenB);
  std::string a1, id;
  ASSERT_TRUE(a.Create(&a1).ok());
  std::vector<std::string> theirs(3);
  for (std::string& b_id : theirs) ASSERT_TRUE(b.Create(&b_id).ok());
  grpc::Status status = b.Create(&id);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              HasSubstr("max_sessions_per_tenant: this caller holds 3 live session(s) of model "
                        "'small', its limit (3"));
  status = a.Create(&id);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              HasSubstr("max_sessions: model 'small' has its max_sessions 4 live sessions (1 of "
                        "them this caller's)"));
  // Memory: a quarter of the 1 MiB budget per tenant, 128 blocks of 16
  // tokens. B fills two sessions with 1024 tokens each: exactly its limit.
  ASSERT_TRUE(b.Append(theirs[0], 1024).ok());
  ASSERT_TRUE(b.Append(theirs[1], 1024).ok());
  status = b.Append(theirs[2], 1);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(
      status.error_message(),
      HasSubstr("session_memory_per_tenant_bytes: this caller's sessions hold 262144 bytes"));
  // A's session is there and takes tokens; B's refused append left nothing.
  EXPECT_TRUE(a.Append(a1, 16).ok());
  v1::SessionInfo info;
  ASSERT_TRUE(b.Get(theirs[2], &info).ok());
  EXPECT_EQ(info.length(), 0);
  EXPECT_EQ(server->sessions()->tenant_usage(HashHex(kTokenB)).bytes, 262144);
}

// Item 4: when the whole budget is spent, an append may evict another
// tenant's idle session only if that tenant holds more than its fair share
// (the budget over the tenants holding memory). Here both tenants may use the
// whole budget; B fills it again and again and A's small session stays.
// Before tenants, B's first eviction took A's session, the least recently used.
TEST(SessionTenantTest, MemoryEvictionSparesATenantWithinItsFairShare) {
  auto server = StartServer(true, [](ServerOptions& o) {
    o.sessions.max_sessions_per_tenant = 100;
    o.sessions.memory_per_tenant_bytes = 1 << 20;
    o.sessions.evict_grace = absl::ZeroDuration();
  });
  ASSERT_NE(server, nullptr);
  Caller a(*server, kTokenA), b(*server, kTokenB);
  std::string a1;
  ASSERT_TRUE(a.Create(&a1).ok());
  ASSERT_TRUE(a.Append(a1, 64).ok());
  for (int i = 0; i < 20; ++i) {  // 64 blocks each: the 1 MiB slab holds 512.
    std::string id;
    ASSERT_TRUE(b.Create(&id).ok());
    const grpc::Status status = b.Append(id, 1024);
    ASSERT_TRUE(status.ok()) << i << ": " << status.error_message();
  }
  EXPECT_GE(Ends(*server, SessionEnd::kEvictedMemory), 12);
  v1::SessionInfo info;
  const grpc::Status status = a.Get(a1, &info);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(info.length(), 64);
}

// Without tokens every caller is one tenant and the defaults keep the
// limits it always had: all of max_sessions, its own least recently used
// idle session evicted for a new one, and the eviction says why.
TEST(SessionTenantTest, WithoutTokensTheOneTenantKeepsItsLimits) {
  auto server = StartServer(false, [](ServerOptions& o) {
    o.sessions.max_sessions = 4;
    o.sessions.evict_grace = absl::ZeroDuration();
  });
  ASSERT_NE(server, nullptr);
  Caller anyone(*server, "");
  std::vector<std::string> ids(6);
  for (std::string& id : ids) ASSERT_TRUE(anyone.Create(&id).ok());
  EXPECT_EQ(server->sessions()->tenant_usage("").sessions, 4);
  EXPECT_EQ(Ends(*server, SessionEnd::kEvictedModelSessions), 2);
  v1::SessionInfo info;
  const grpc::Status first = anyone.Get(ids[0], &info);
  EXPECT_EQ(first.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(first.error_message(),
              HasSubstr("to make room for a new session of the same caller (the model's "
                        "max_sessions)"));
  // Its memory limit is the whole budget: 200 blocks (a quarter is 128).
  ASSERT_TRUE(anyone.Append(ids[5], 3200).ok());
}

}  // namespace
}  // namespace attention
