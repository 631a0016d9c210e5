// Scale-out as a platform runs it, driven through attention-client load with
// its default flags: a replica added behind a DNS name gets traffic from
// clients already connected (the server's max connection age makes them
// re-resolve), and a replica draining (SIGTERM) or dying (SIGKILL) mid-load
// costs no request, large ones included.
#include <fstream>
#include <functional>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/fixture/server_test_util.h"

namespace attention {
namespace {

// Requests `server` answered OK through `method`.
double OkCount(const testing::ServerProcess& server, const std::string& method = "Infer") {
  const std::string metrics = testing::HttpGet(server.metrics_port(), "/metrics", server.host());
  return testing::MetricValue(metrics, "attention_requests_total",
                              {"code=\"OK\"", "method=\"" + method + "\"", "model=\"demo\""});
}

// Waits (bounded, 60 s) until `server` has answered `count` requests OK.
bool AwaitServed(const testing::ServerProcess& server, double count,
                 const std::string& method = "Infer") {
  for (const absl::Time until = absl::Now() + absl::Seconds(60); absl::Now() < until;) {
    if (OkCount(server, method) >= count) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// Waits (bounded, 60 s) until `a` or `b` has answered `count` requests OK
// through `method`; returns that replica, or nullptr. (Round robin places a
// stream for its whole life on a replica that was ready when it opened: a
// client's first few streams may all land on either one.)
testing::ServerProcess* AwaitServedByEither(testing::ServerProcess& a, testing::ServerProcess& b,
                                            double count, const std::string& method) {
  for (const absl::Time until = absl::Now() + absl::Seconds(60); absl::Now() < until;) {
    if (OkCount(a, method) >= count) return &a;
    if (OkCount(b, method) >= count) return &b;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return nullptr;
}

// The result of one `attention-client load` level.
struct LoadResult {
  int exit_code = -1;
  std::string output;
  int64_t ok = 0;
  int64_t errors = 0;
};

// Runs `command` (an attention-client load at one concurrency level that
// writes --json=`json`) and reads its result.
LoadResult RunLoad(const std::string& command, const std::string& json) {
  LoadResult r;
  r.exit_code = testing::RunCommand(command, &r.output);
  std::ifstream in(json);
  const nlohmann::json levels = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!levels.is_array() || levels.empty()) return r;
  r.ok = levels[0]["requests"].get<int64_t>();
  for (const auto& [code, count] : levels[0]["errors"].items()) r.errors += count.get<int64_t>();
  return r;
}

std::string LoadCommand(const std::string& server, const std::string& flags,
                        const std::string& json) {
  return absl::StrCat(ATTENTION_CLIENT_BINARY, " load --server=", server,
                      " --concurrency=4 --deadline_ms=20000 --json=", json, " ", flags);
}

std::string Ipv4Targets(const testing::ServerProcess& a, const testing::ServerProcess& b) {
  return absl::StrCat("ipv4:", a.target(), ",", b.target());
}

// Runs `attention-client load <flags>` over replicas a and b; once one of
// them has answered `served` requests through `method` (or a minute has
// passed), calls `disrupt` on it (on `a` after the minute), then waits for
// the load to end. `awaited` says whether one served that many first.
struct DisruptedLoad {
  LoadResult result;
  bool started = false;  // Set by LoadWhileOnTwoReplicas.
  bool awaited = false;
  std::string json;
};
DisruptedLoad LoadWhile(testing::ServerProcess& a, testing::ServerProcess& b,
                        const std::string& flags, const std::string& name, double served,
                        const std::string& method,
                        const std::function<void(testing::ServerProcess&)>& disrupt) {
  DisruptedLoad run;
  run.json = ::testing::TempDir() + "/scale_out_" + name + ".json";
  std::thread load(
      [&] { run.result = RunLoad(LoadCommand(Ipv4Targets(a, b), flags, run.json), run.json); });
  testing::ServerProcess* busy = AwaitServedByEither(a, b, served, method);
  run.awaited = busy != nullptr;
  disrupt(busy != nullptr ? *busy : a);
  load.join();
  return run;
}

// Starts two replicas (one compute thread each) and runs LoadWhile over
// them; `started` says whether both started.
DisruptedLoad LoadWhileOnTwoReplicas(const std::string& flags, const std::string& name,
                                     double served, const std::string& method,
                                     const std::function<void(testing::ServerProcess&)>& disrupt) {
  testing::ServerProcess a(ATTENTION_SERVER_BINARY, {"--threads=1"});
  testing::ServerProcess b(ATTENTION_SERVER_BINARY, {"--threads=1"});
  if (!a.ok() || !b.ok()) return {};
  DisruptedLoad run = LoadWhile(a, b, flags, name, served, method, disrupt);
  run.started = true;
  return run;
}

// The load ran, lost no request and was served more than `min_ok` times.
void ExpectNothingLost(const DisruptedLoad& run, int64_t min_ok) {
  ASSERT_TRUE(run.started);
  ASSERT_TRUE(run.awaited);
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  EXPECT_EQ(run.result.errors, 0) << run.result.output;
  EXPECT_GT(run.result.ok, min_ok);
}

TEST(ScaleOutClientTest, NewReplicaBehindTheNameGetsTrafficFromConnectedClients) {
  std::string output;
  if (testing::RunCommand("unshare -m true", &output) != 0) {
    GTEST_SKIP() << "needs root for a private mount namespace (unshare -m): " << output;
  }
  // One port, two loopback addresses; the name attn.test resolves through a
  // hosts file bind-mounted over /etc/hosts in the client's own namespace.
  const int port = testing::FreePort();
  const std::vector<std::string> flags = {"--threads=1", "--max_connection_age_s=1",
                                          "--max_connection_age_grace_s=5"};
  testing::ServerProcess first(ATTENTION_SERVER_BINARY, flags, "127.0.0.1", port);
  testing::ServerProcess second(ATTENTION_SERVER_BINARY, flags, "127.0.0.2", port);
  ASSERT_TRUE(first.ok() && second.ok());
  const std::string hosts = ::testing::TempDir() + "/scale_out_hosts";
  std::ofstream(hosts) << "127.0.0.1 localhost\n127.0.0.1 attn.test\n";
  const std::string json = ::testing::TempDir() + "/scale_out_reresolve.json";
  const std::string command = absl::StrCat(
      "unshare -m sh -c 'mount --bind ", hosts, " /etc/hosts && exec env GRPC_DNS_RESOLVER=native ",
      LoadCommand(absl::StrCat("dns:///attn.test:", port), "--duration=10s --seq_len=16", json),
      "'");
  LoadResult result;
  std::thread load([&] { result = RunLoad(command, json); });
  // Once the client is connected to the first replica, the name gains the
  // second (written in place: the bind mount keeps the inode).
  const bool connected = AwaitServed(first, 50);
  std::ofstream(hosts, std::ios::trunc) << "127.0.0.1 localhost\n127.0.0.1 attn.test\n"
                                        << "127.0.0.2 attn.test\n";
  load.join();
  ASSERT_TRUE(connected) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.errors, 0) << result.output;
  const double a = OkCount(first), b = OkCount(second);
  EXPECT_EQ(a + b, result.ok);
  // Re-resolved within a few connection ages, the new replica serves about
  // half of what is left of the 10 s: a fair share, not 0.
  std::cout << "requests served: first replica " << a << ", added replica " << b << "\n";
  EXPECT_GE(b, 0.15 * (a + b)) << "first " << a << ", second " << b;
}

TEST(ScaleOutClientTest, DefaultClientLosesNothingWhenAReplicaDrains) {
  ExpectNothingLost(
      LoadWhileOnTwoReplicas("--duration=4s --seq_len=16", "drain", 50, "Infer",
                             // SIGTERM: NOT_SERVING, refuses, drains, exits 0.
                             [](testing::ServerProcess& s) { EXPECT_EQ(s.Stop(), 0); }),
      100);
}

TEST(ScaleOutClientTest, LargeRequestsAreRetriedWhenAReplicaDies) {
  // 512 x 256 float32 queries (512 KiB) exceed gRPC's default 256 KiB retry
  // buffer: without a larger one they would fail instead of being retried.
  ExpectNothingLost(LoadWhileOnTwoReplicas("--duration=4s --seq_len=512", "kill", 10, "Infer",
                                           [](testing::ServerProcess& s) { s.Kill(); }),
                    20);
}

TEST(ScaleOutClientTest, StreamLoadCountsABrokenStreamOnceAndKeepsItsConcurrency) {
  const DisruptedLoad run =
      LoadWhileOnTwoReplicas("--rpc=stream --duration=3s --seq_len=16", "stream", 20, "InferStream",
                             [](testing::ServerProcess& s) { s.Kill(); });
  ASSERT_TRUE(run.started);
  ASSERT_TRUE(run.awaited);
  // (It exits 1: the level had errors.) Each of the 4 workers' streams on the
  // killed replica breaks once: one error each (its status), never a second
  // for the same failure.
  EXPECT_LE(run.result.errors, 4) << run.result.output;
  EXPECT_EQ(run.result.output.find("STREAM_BROKEN"), std::string::npos) << run.result.output;
  // The workers reopened their streams on the survivor and ran the whole 3 s.
  std::ifstream in(run.json);
  const nlohmann::json levels = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(levels.is_array() && !levels.empty());
  EXPECT_GE(levels[0]["seconds"].get<double>(), 2.9) << run.result.output;
  EXPECT_GT(run.result.ok, 100);
}

}  // namespace
}  // namespace attention
