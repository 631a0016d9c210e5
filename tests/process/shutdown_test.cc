// The server's shutdown order (issue 21, item 8c): the session manager, whose
// reaper ends expired sessions and reads their models, is destroyed before
// the model repository. Before the fix Drain freed the models first; a
// session expiring in that window was ended on a freed ServedModel
// (SessionManager::EndLocked): a heap-use-after-free under ASan (the test is
// in scripts/sanitize.sh's ASan list), and in a plain build the expiry was
// counted through the freed model's metrics pointer.
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "server/batching/pending_request.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::server::ServedModel;

TEST(ShutdownOrderTest, SessionReaperNeverEndsASessionOfAFreedModel) {
  // Two models: the repository frees "b" first, then waits for "a"'s batcher.
  testing::ModelFolder models("shutdown_test");
  models.Add("a", testing::SelfAttentionSpec(16, 2), 1);
  models.Add("b", testing::SelfAttentionSpec(16, 2), 2);
  std::unique_ptr<server::AttentionServer> server =
      testing::StartServer(testing::TestServerOptions(models.path()));
  ASSERT_NE(server, nullptr);
  const ServedModel* a = server->repository()->Find("a").get();
  const ServedModel* b = server->repository()->Find("b").get();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // Owned by the server's Metrics, which outlive the models.
  prometheus::Counter* expired =
      b->metrics->session_ends[static_cast<int>(server::SessionEnd::kExpired)];

  // A session of "b" that expires one second after its last use: at the
  // reaper's second tick, while the shutdown below is under way.
  auto stub = v1::SessionService::NewStub(server->InProcessChannel());
  grpc::ClientContext context;
  v1::CreateSessionRequest create;
  create.set_model("b");
  create.set_kind(v1::SESSION_KIND_SELF);
  create.set_ttl_s(1);
  v1::SessionInfo session;
  const grpc::Status created = stub->CreateSession(&context, create, &session);
  ASSERT_TRUE(created.ok()) << created.error_message();

  // "a"'s batcher is kept busy (no call waits for it): a request dropped at
  // once, whose answer blocks until released. The repository's destructor
  // waits for it with "b" already freed.
  absl::Notification entered, release;
  auto blocker = std::make_unique<server::PendingRequest>();
  blocker->deadline = absl::InfinitePast();
  blocker->done = [&](server::RequestOutcome) {
    entered.Notify();
    release.WaitForNotification();
  };
  ASSERT_TRUE(a->batcher->Enqueue(std::move(blocker)).ok());
  entered.WaitForNotification();
  ASSERT_EQ(expired->Value(), 0) << "the session expired before the shutdown began";

  // The window stays open for three of the reaper's one-second ticks (the
  // session expires at one of them); nothing asserts on the timing.
  std::thread releaser([&] {
    absl::SleepFor(absl::Seconds(3));
    release.Notify();
  });
  EXPECT_TRUE(server->Drain());
  releaser.join();
  EXPECT_EQ(expired->Value(), 0) << "the session reaper ended a session after its model was freed";
  server.reset();
  std::filesystem::remove_all(models.path());
}

}  // namespace
}  // namespace attention
