// Poll-mode rollouts and drain while loads are pending (issue 33, items 3
// and 4): a version refused for --max_model_bytes is retried once room
// frees, one that ran out of memory loading is not retried at every poll;
// a version folder replaced between two polls, or a poll between the
// removal and the rename, keeps the old version serving until the new one
// serves (per policy); a scan that fails part-way
// keeps what serves; a drain answers queued loads UNAVAILABLE and abandons
// the load in progress at its deadline.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "absl/synchronization/notification.h"
#include "attention/v1/attention.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/batching/model_bytes.h"
#include "tests/fixture/model_versions_fixture.h"

namespace attention {
namespace {

using namespace ::attention::model_versions_test;  // NOLINT: the shared helpers.

// Writes `v` under a hidden name and renames it into place (as WriteVersion)
// after removing `remove` (a version folder), both between two polls.
void ReplaceVersion(const std::string& model_dir, int64_t remove, int64_t v, uint64_t seed) {
  const std::string tmp = model_dir + "/." + std::to_string(v) + ".tmp";
  testing::WriteModelDir(*RandomModel(seed), tmp);
  fs::remove_all(model_dir + "/" + std::to_string(remove));
  fs::rename(tmp, model_dir + "/" + std::to_string(v));
}

int64_t ServingVersion(AttentionServer& server, const std::string& model, int64_t version = 0) {
  auto m = server.repository()->Find(model, version);
  return m == nullptr ? 0 : m->version;
}

// A load that runs out of memory after its version was made (the hook
// stands for MhaModel's or MhaEngine's bad_alloc, RESOURCE_EXHAUSTED) is a
// failure, not a refusal for room: freeing its own half-made version is no
// room for it, so later polls do not load it again until its folder changes.
TEST(ModelRolloutTest, ALoadOutOfMemoryIsNotRetriedAtEveryPoll) {
  const std::string repo = NewModelRepo("oom", 90);
  const int64_t one = server::EstimateModelBytes(repo + "/m/1");
  std::atomic<int> loads_of_2{0};
  auto server = Start(repo, ModelControl::kPoll, [&](ServerOptions& o) {
    o.repository.load_hook = [&](const std::string&, int64_t version,
                                 const std::function<bool()>&) {
      if (version != 2) return absl::OkStatus();
      ++loads_of_2;
      return absl::ResourceExhaustedError("model load: out of memory (std::bad_alloc)");
    };
  });
  WriteVersion(repo + "/m", 2, 91);
  server->repository()->Poll();  // Seen once.
  server->repository()->Poll();  // Loaded: out of memory.
  ASSERT_EQ(loads_of_2.load(), 1);
  // Its own half-made version is freed (on the reaper's thread).
  ASSERT_TRUE(Eventually([&] { return server->repository()->resident_bytes() == one; }));
  for (int i = 0; i < 3; ++i) server->repository()->Poll();
  EXPECT_EQ(loads_of_2.load(), 1);
  EXPECT_EQ(LoadCount(*server, "m", "2", "failure"), 1);
  EXPECT_EQ(ServingVersion(*server, "m"), 1);
  EXPECT_TRUE(server->repository()->AllServing());
  // Its folder changes (rewritten): tried again, once.
  fs::remove_all(repo + "/m/2");
  WriteVersion(repo + "/m", 2, 92);
  for (int i = 0; i < 3; ++i) server->repository()->Poll();
  EXPECT_EQ(loads_of_2.load(), 2);
  EXPECT_EQ(ServingVersion(*server, "m"), 1);
  server->Drain();
}

// A version refused for room is not a broken folder: it is retried on a
// later poll once something was freed, and not before.
TEST(ModelRolloutTest, AVersionRefusedForRoomIsRetriedOnceRoomFrees) {
  const std::string repo = NewRepo("room");
  for (const char* m : {"a", "b"}) {
    fs::create_directories(repo + "/" + m);
    WriteVersion(repo + "/" + m, 1, 10);
  }
  const int64_t one = server::EstimateModelBytes(repo + "/a/1");
  auto server = Start(repo, ModelControl::kPoll,
                      [&](ServerOptions& o) { o.repository.max_model_bytes = 2 * one + one / 2; });
  WriteVersion(repo + "/a", 2, 11);
  for (int i = 0; i < 4; ++i) server->repository()->Poll();
  EXPECT_EQ(ServingVersion(*server, "a"), 1);
  EXPECT_EQ(LoadCount(*server, "a", "2", "refused"), 1);  // Nothing freed: not retried.
  fs::remove_all(repo + "/b");                            // b leaves: its version is freed.
  server->repository()->Poll();
  ASSERT_TRUE(Eventually([&] { return server->repository()->resident_bytes() == one; }));
  server->repository()->Poll();
  EXPECT_EQ(ServingVersion(*server, "a"), 2);
  EXPECT_EQ(LoadCount(*server, "a", "2", "success"), 1);
  server->Drain();
}

// Version 1 removed and version 2 renamed into place between two polls:
// the first poll sees version 2 once (not loaded yet), and version 1 keeps
// serving (and the server ready) until version 2 serves.
TEST(ModelRolloutTest, AReplacedVersionFolderKeepsTheOldServingUntilTheNewServes) {
  const std::string repo = NewModelRepo("replaced", 20);
  // "all": version 1 removed, version 2 added.
  fs::create_directories(repo + "/all");
  std::ofstream(repo + "/all/config.json") << R"({"version_policy": "all"})";
  WriteVersion(repo + "/all", 1, 21);
  // "specific": the policy moves from 1 to 3 as 3 is written.
  fs::create_directories(repo + "/specific");
  std::ofstream(repo + "/specific/config.json") << R"({"version_policy": {"specific": [1]}})";
  WriteVersion(repo + "/specific", 1, 22);
  // "latest2": versions 1 and 2 serve; 1 is removed as 3 is added.
  fs::create_directories(repo + "/latest2");
  std::ofstream(repo + "/latest2/config.json") << R"({"version_policy": {"latest": 2}})";
  WriteVersion(repo + "/latest2", 1, 23);
  WriteVersion(repo + "/latest2", 2, 24);
  auto server = Start(repo, ModelControl::kPoll);
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  std::mt19937 rng(4);
  const Tensor q = RandomTensor({1, 3, kE}, rng);

  ReplaceVersion(repo + "/m", 1, 2, 30);
  ReplaceVersion(repo + "/all", 1, 2, 31);
  std::ofstream(repo + "/specific/config.json") << R"({"version_policy": {"specific": [3]}})";
  WriteVersion(repo + "/specific", 3, 32);
  ReplaceVersion(repo + "/latest2", 1, 3, 33);
  server->repository()->Poll();  // Every new version seen once: none loads yet.
  EXPECT_EQ(ServingVersion(*server, "m"), 1);
  EXPECT_EQ(ServingVersion(*server, "all"), 1);
  EXPECT_EQ(ServingVersion(*server, "specific"), 1);
  // latest 2: version 2 still serves, so the removed version 1 goes.
  EXPECT_EQ(ServingVersion(*server, "latest2"), 2);
  EXPECT_EQ(ServingVersion(*server, "latest2", 1), 0);
  EXPECT_TRUE(server->repository()->AllServing());
  v1::InferResponse r;
  const grpc::Status s = Infer(*stub, q, 0, &r);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(r.model_version(), 1);

  server->repository()->Poll();  // Unchanged across two polls: loaded, the old unloaded.
  EXPECT_EQ(ServingVersion(*server, "m"), 2);
  EXPECT_EQ(ServingVersion(*server, "m", 1), 0);
  EXPECT_EQ(ServingVersion(*server, "all"), 2);
  EXPECT_EQ(ServingVersion(*server, "all", 1), 0);
  EXPECT_EQ(ServingVersion(*server, "specific"), 3);
  EXPECT_EQ(ServingVersion(*server, "specific", 1), 0);
  EXPECT_EQ(ServingVersion(*server, "latest2"), 3);
  EXPECT_EQ(ServingVersion(*server, "latest2", 2), 2);
  EXPECT_TRUE(server->repository()->AllServing());

  // A version removed with no replacement on its way goes (as Triton and
  // TF Serving do): the model's folder has no version left. The first poll
  // that sees it so may be mid-swap (see the next test): the version goes
  // at the second.
  fs::remove_all(repo + "/m/2");
  server->repository()->Poll();
  EXPECT_EQ(ServingVersion(*server, "m"), 2);
  server->repository()->Poll();
  EXPECT_EQ(ServingVersion(*server, "m"), 0);
  EXPECT_TRUE(server->repository()->AllServing());  // Readiness no longer waits for it.
  server->Drain();
}

// A poll between `rm -r m/1` and `mv m/.2.tmp m/2` sees the model's folder
// with only its config.json (the version policy): not a model gone, so
// version 1 keeps serving (and the server ready) until version 2 serves.
TEST(ModelRolloutTest, APollBetweenRemoveAndRenameKeepsTheOldVersionServing) {
  const std::string repo = NewModelRepo("mid_swap", 80, R"({"version_policy": {"latest": 1}})");
  auto server = Start(repo, ModelControl::kPoll);
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  std::mt19937 rng(8);
  const Tensor q = RandomTensor({1, 3, kE}, rng);
  auto expect_served_by = [&](int64_t version) {
    v1::InferResponse r;
    const grpc::Status s = Infer(*stub, q, 0, &r);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(r.model_version(), version);
    EXPECT_TRUE(server->repository()->AllServing());
  };

  const std::string tmp = repo + "/m/.2.tmp";
  testing::WriteModelDir(*RandomModel(81), tmp);
  fs::remove_all(repo + "/m/1");
  server->repository()->Poll();  // Only m/config.json (and the hidden .2.tmp).
  EXPECT_EQ(ServingVersion(*server, "m"), 1);
  expect_served_by(1);

  fs::rename(tmp, repo + "/m/2");
  server->repository()->Poll();  // Version 2 seen once.
  EXPECT_EQ(ServingVersion(*server, "m"), 1);
  expect_served_by(1);
  server->repository()->Poll();  // Unchanged: loaded; version 1 unloads.
  EXPECT_EQ(ServingVersion(*server, "m"), 2);
  EXPECT_EQ(ServingVersion(*server, "m", 1), 0);
  expect_served_by(2);
  EXPECT_EQ(LoadCount(*server, "m", "1", "success"), 1);  // Never reloaded.
  server->Drain();
}

// A repository entry that cannot be examined (here a link through a
// symlink loop: as an I/O error on a network volume) is not a model gone:
// what it served keeps serving, and the next good poll changes nothing.
TEST(ModelRolloutTest, AnEntryThatCannotBeReadKeepsServing) {
  const std::string repo = NewRepo("unreadable");
  testing::WriteModelDir(*RandomModel(40), repo + "/..v1/p/1");
  fs::create_directory_symlink("..v1", repo + "/..data");
  fs::create_directory_symlink("..data/p", repo + "/p");
  fs::create_directories(repo + "/q");
  WriteVersion(repo + "/q", 1, 41);
  auto server = Start(repo, ModelControl::kPoll);
  ASSERT_EQ(ServingVersion(*server, "p"), 1);
  fs::create_directory_symlink("..data", repo + "/..data_tmp");  // "..data" -> itself.
  fs::rename(repo + "/..data_tmp", repo + "/..data");
  server->repository()->Poll();
  EXPECT_EQ(ServingVersion(*server, "p"), 1);
  EXPECT_EQ(ServingVersion(*server, "q"), 1);
  EXPECT_TRUE(server->repository()->AllServing());
  fs::create_directory_symlink("..v1", repo + "/..data_tmp");
  fs::rename(repo + "/..data_tmp", repo + "/..data");
  server->repository()->Poll();
  server->repository()->Poll();
  EXPECT_EQ(ServingVersion(*server, "p"), 1);
  EXPECT_EQ(LoadCount(*server, "p", "1", "success"), 1);  // Never unloaded, never reloaded.
  server->Drain();
}

// The scan seam: a repository or model folder that cannot be listed (as
// ListDirectory reports a listing that fails part-way) changes nothing for
// what it could not read, and nothing is refused for it.
TEST(ModelRolloutTest, AFailedScanChangesNothingAndIsRetried) {
  const std::string repo = NewRepo("failed_scan");
  for (const char* m : {"a", "b"}) {
    fs::create_directories(repo + "/" + m);
    WriteVersion(repo + "/" + m, 1, 60);
  }
  absl::Mutex mu;
  std::string failing;  // Guarded by mu: the folder whose listing fails.
  auto server = Start(repo, ModelControl::kPoll, [&](ServerOptions& o) {
    o.repository.list_directory = [&](const std::string& dir) {
      {
        absl::MutexLock lock(&mu);
        if (!failing.empty() && dir == failing) {
          return absl::StatusOr<std::vector<server::DirEntry>>(
              absl::UnavailableError(dir + ": listing failed part-way: Input/output error"));
        }
      }
      return server::ListDirectory(dir);
    };
  });
  auto fail = [&](const std::string& dir) {
    absl::MutexLock lock(&mu);
    failing = dir;
  };
  WriteVersion(repo + "/a", 2, 61);
  for (const std::string& dir : {repo, repo + "/a", repo + "/a/2"}) {
    fail(dir);
    for (int i = 0; i < 3; ++i) server->repository()->Poll();
    EXPECT_EQ(ServingVersion(*server, "a"), 1) << "failing " << dir;
    EXPECT_EQ(ServingVersion(*server, "b"), 1) << "failing " << dir;
    EXPECT_TRUE(server->repository()->AllServing()) << "failing " << dir;
  }
  EXPECT_EQ(LoadCount(*server, "a", "2", "failure"), 0);
  fail("");
  server->repository()->Poll();
  server->repository()->Poll();
  EXPECT_EQ(ServingVersion(*server, "a"), 2);
  EXPECT_EQ(ServingVersion(*server, "b"), 1);
  server->Drain();
}

// Loads queued behind a busy control thread when the drain starts are
// answered UNAVAILABLE at once, not run.
TEST(ModelRolloutTest, DrainAnswersQueuedLoadsUnavailable) {
  const std::string repo = NewModelRepo("queued", 50);
  auto server = Start(repo, ModelControl::kExplicit);
  fs::create_directories(repo + "/n");  // A model not loaded yet.
  WriteVersion(repo + "/n", 1, 51);
  absl::Notification busy, release;
  server->repository()->Run([&] {  // Holds the control thread.
    busy.Notify();
    release.WaitForNotification();
  });
  busy.WaitForNotification();
  constexpr int kLoads = 4;
  absl::Mutex mu;
  std::vector<absl::Status> answers;  // Guarded by mu.
  for (int i = 0; i < kLoads; ++i) {
    server->service().ControlModel(server::CallContext{}, "n", /*load=*/true,
                                   [&](const absl::Status& status) {
                                     absl::MutexLock lock(&mu);
                                     answers.push_back(status);
                                   });
  }
  std::thread drain([&] { server->Drain(); });
  const bool answered = Eventually([&] {
    absl::MutexLock lock(&mu);
    return answers.size() == kLoads;
  });
  release.Notify();
  drain.join();
  EXPECT_TRUE(answered) << "the queued loads were not answered while the control thread was busy";
  absl::MutexLock lock(&mu);
  ASSERT_EQ(answers.size(), kLoads);
  for (const absl::Status& s : answers) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_NE(s.message().find("shutting down"), std::string::npos) << s;
  }
}

// A load still running at the drain deadline is abandoned at its next check
// (the hook stands for a large model's reading) and answered UNAVAILABLE.
TEST(ModelRolloutTest, DrainAbandonsTheLoadInProgressAtItsDeadline) {
  const std::string repo = NewModelRepo("abandon", 70);
  std::atomic<bool> slow{false};
  absl::Notification loading;
  auto server = Start(repo, ModelControl::kExplicit, [&](ServerOptions& o) {
    o.drain_timeout = absl::Milliseconds(300);
    o.repository.load_hook = [&](const std::string&, int64_t,
                                 const std::function<bool()>& abandoned) {
      if (!slow.load()) return absl::OkStatus();
      loading.Notify();
      for (int i = 0; i < 6000 && !abandoned(); ++i) absl::SleepFor(absl::Milliseconds(10));
      return abandoned() ? absl::CancelledError("abandoned") : absl::OkStatus();
    };
  });
  slow = true;
  fs::create_directories(repo + "/n");  // A model not loaded yet.
  WriteVersion(repo + "/n", 1, 71);
  absl::Notification answered;
  absl::Status answer;
  server->service().ControlModel(server::CallContext{}, "n", /*load=*/true,
                                 [&](const absl::Status& status) {
                                   answer = status;
                                   answered.Notify();
                                 });
  ASSERT_TRUE(loading.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_FALSE(server->Drain());  // A load was abandoned.
  ASSERT_TRUE(answered.HasBeenNotified());
  EXPECT_EQ(answer.code(), absl::StatusCode::kUnavailable) << answer;
  EXPECT_NE(answer.message().find("abandoned"), std::string::npos) << answer;
}

}  // namespace
}  // namespace attention
