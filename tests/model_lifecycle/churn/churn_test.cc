// The churn test (issue 33, "the class"): every kind of call runs against a
// model that is loaded, unloaded, polled in and replaced continuously, and a
// drain starts while calls are in flight. Invariants:
// * the server never dies (under ASan in scripts/sanitize.sh: nothing it
//   frees is touched afterwards);
// * every call gets a code from the documented list (churn_calls.h);
// * every answer equals the reference of the version it names;
// * once calls end and the model is unloaded, no version stays resident and
//   no session is live;
// * the drain ends within its timeout.
//
// CHURN_SECONDS sets the run's length (default 10: both phases together);
// scripts/sanitize.sh runs it for 60 s under ASan, and by hand:
//   CHURN_SECONDS=600 build/bin/server_churn_test
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/fixture/model_versions_fixture.h"
#include "tests/model_lifecycle/churn/churn_calls.h"

namespace attention::churn_test {
namespace {

using namespace ::attention::model_versions_test;  // NOLINT: the shared helpers.
namespace fs = std::filesystem;

absl::Duration PhaseLength() {
  const char* env = std::getenv("CHURN_SECONDS");
  const int seconds = env != nullptr ? std::max(2, std::atoi(env)) : 10;
  return absl::Seconds(seconds) / 2;
}

uint64_t SeedOf(int64_t version) { return 1000 + static_cast<uint64_t>(version); }

// The server, the calls and the threads making them.
class Churn {
 public:
  explicit Churn(ModelControl control)
      : repo_(NewRepo(control == ModelControl::kPoll ? "churn_poll" : "churn_explicit")) {
    fs::create_directories(repo_ + "/m");
    AddVersion();
    server_ = Start(repo_, control, [](ServerOptions& o) {
      o.http_port = 0;
      o.drain_timeout = absl::Seconds(5);
    });
    // Over TCP: an in-process channel must not outlive its server, and the
    // drain shuts the server down under running calls.
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                   grpc::InsecureChannelCredentials());
    calls_ = std::make_unique<ChurnCalls>(channel_, server_->http_port());
    calls_->AddVersion(1, models_[1]);
  }

  // Writes the next version's folder (its model registered first).
  int64_t AddVersion() {
    const int64_t v = ++newest_;
    models_[v] = RandomModel(SeedOf(v));
    if (calls_ != nullptr) calls_->AddVersion(v, models_[v]);
    WriteVersion(repo_ + "/m", v, SeedOf(v));
    return v;
  }
  // Removes version folders older than the newest `keep`.
  void RemoveOld(int64_t keep) {
    for (int64_t v = 1; v <= newest_ - keep; ++v) fs::remove_all(repo_ + "/m/" + std::to_string(v));
  }

  // Starts `n` threads making calls of every kind until Stop().
  void StartCalls(int n) {
    for (int t = 0; t < n; ++t) {
      threads_.emplace_back([this, t] {
        std::mt19937 rng(77 + t);
        while (!stop_.load()) {
          calls_->Run(static_cast<Kind>(rng() % static_cast<int>(Kind::kCount)), rng);
        }
      });
    }
  }
  void Stop() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  // Every kind of call was answered OK at least once.
  void ExpectEveryKindAnswered() const {
    for (int k = 0; k < static_cast<int>(Kind::kCount); ++k) {
      EXPECT_GT(calls_->Count(static_cast<Kind>(k), grpc::StatusCode::OK), 0)
          << KindName(static_cast<Kind>(k)) << " never answered OK: " << calls_->Summary();
    }
  }

  AttentionServer& server() { return *server_; }
  ChurnCalls& calls() { return *calls_; }
  v1::AttentionService::Stub& admin() {
    if (admin_ == nullptr) admin_ = v1::AttentionService::NewStub(channel_);
    return *admin_;
  }

 private:
  const std::string repo_;
  std::map<int64_t, std::shared_ptr<const MhaModel>> models_;  // Only the control thread.
  int64_t newest_ = 0;
  std::unique_ptr<AttentionServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ChurnCalls> calls_;
  std::unique_ptr<v1::AttentionService::Stub> admin_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

grpc::Status Control(v1::AttentionService::Stub& stub, bool load) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  if (load) {
    v1::LoadModelRequest request;
    request.set_name("m");
    v1::LoadModelResponse response;
    return stub.LoadModel(&context, request, &response);
  }
  v1::UnloadModelRequest request;
  request.set_name("m");
  v1::UnloadModelResponse response;
  return stub.UnloadModel(&context, request, &response);
}

// Explicit control: new versions loaded over serving ones (their old
// folders removed), unloads and reloads through the RPCs, while every kind
// of call runs; then the calls end, the model is unloaded, and nothing may
// stay resident.
TEST(ChurnTest, ExplicitLoadsAndUnloadsUnderEveryKindOfCall) {
  Churn churn(ModelControl::kExplicit);
  churn.StartCalls(3);
  std::mt19937 rng(5);
  const absl::Time end = absl::Now() + PhaseLength();
  while (absl::Now() < end) {
    switch (rng() % 4) {
      case 0:
      case 1: {
        churn.AddVersion();
        const grpc::Status loaded = Control(churn.admin(), /*load=*/true);
        EXPECT_TRUE(loaded.ok()) << loaded.error_message();
        if (rng() % 2 == 0) churn.RemoveOld(1);
        break;
      }
      case 2: {
        const grpc::Status unloaded = Control(churn.admin(), /*load=*/false);
        EXPECT_TRUE(unloaded.ok() || unloaded.error_code() == grpc::StatusCode::NOT_FOUND)
            << unloaded.error_message();
        absl::SleepFor(absl::Milliseconds(rng() % 50));
        const grpc::Status loaded = Control(churn.admin(), /*load=*/true);
        EXPECT_TRUE(loaded.ok()) << loaded.error_message();
        break;
      }
      default: {
        const grpc::Status loaded = Control(churn.admin(), /*load=*/true);  // Re-read, unchanged.
        EXPECT_TRUE(loaded.ok()) << loaded.error_message();
      }
    }
    absl::SleepFor(absl::Milliseconds(20 + rng() % 80));
  }
  churn.Stop();
  std::cerr << "churn (explicit): " << churn.calls().Summary() << "\n";
  EXPECT_EQ(churn.calls().wrong(), 0);
  churn.ExpectEveryKindAnswered();
  ASSERT_TRUE(Control(churn.admin(), /*load=*/false).ok());
  EXPECT_TRUE(Eventually([&] { return churn.server().repository()->resident_bytes() == 0; }))
      << churn.server().repository()->resident_bytes() << " bytes still resident";
  EXPECT_EQ(churn.server().sessions()->live_sessions(), 0);
  churn.server().Drain();
}

// Poll control: versions appear (and old folders vanish, some replaced
// between two polls) while every kind of call runs; then a drain starts
// with calls still in flight and must end within its timeout.
TEST(ChurnTest, PollRolloutsAndADrainUnderEveryKindOfCall) {
  Churn churn(ModelControl::kPoll);
  churn.StartCalls(3);
  std::mt19937 rng(6);
  const absl::Time end = absl::Now() + PhaseLength();
  while (absl::Now() < end) {
    churn.AddVersion();
    if (rng() % 3 == 0) churn.RemoveOld(1);  // Replaced before the poll sees the new one.
    churn.server().repository()->Poll();
    absl::SleepFor(absl::Milliseconds(rng() % 50));
    churn.server().repository()->Poll();  // Stable across two polls: loaded.
    if (rng() % 2 == 0) churn.RemoveOld(1);
    absl::SleepFor(absl::Milliseconds(20 + rng() % 80));
  }
  const absl::Time drain_start = absl::Now();
  churn.server().Drain();
  const absl::Duration drained = absl::Now() - drain_start;
  churn.Stop();
  std::cerr << "churn (poll): " << churn.calls().Summary() << "; drain took " << drained << "\n";
  EXPECT_LT(drained, absl::Seconds(5) + absl::Seconds(5)) << "drain timeout 5 s";
  EXPECT_EQ(churn.calls().wrong(), 0);
  churn.ExpectEveryKindAnswered();
}

}  // namespace
}  // namespace attention::churn_test
