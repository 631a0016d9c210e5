// Memory admission control (--max_inflight_bytes) against a flood: far more
// concurrent large requests than the budget admits. Every request gets a
// correct answer or RESOURCE_EXHAUSTED naming the limit, the server process's
// peak RSS stays within the budget plus a stated margin, and it keeps serving.
// And a flood of connections past the server's file-descriptor limit: it
// closes what it cannot accept, says so, and accepts again afterwards.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "attention/v1/attention.grpc.pb.h"
#include "core/mha_engine.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_util.h"
#include "tests/memory/one_model_process.h"

namespace attention {
namespace {

using testing::ProcStatusBytes;

using ::testing::HasSubstr;

constexpr int64_t kMiB = 1 << 20;
// The budget, and how far above it the peak RSS may go. The budget counts a
// request's message and its response once; beyond it the process holds
// gRPC's receive buffers (capped by a resource quota of the budget's size),
// the parsed copy of each message being refused, and the serialized copy of
// each response being sent: up to about three more budgets, plus the heap's
// slack.
constexpr int64_t kBudget = 32 * kMiB;
constexpr int64_t kMargin = 4 * kBudget;

// "N open, limit M" for process `pid`'s file descriptors.
std::string Descriptors(int pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::error_code ec;
  int64_t open = 0;
  for (auto it = std::filesystem::directory_iterator(proc + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++open;
  }
  std::ifstream limits(proc + "/limits");
  std::string line, limit = "?";
  while (std::getline(limits, line)) {
    if (line.rfind("Max open files", 0) == 0) limit = line.substr(26);
  }
  return absl::StrCat(open, " open, limit (soft hard) ", limit);
}

TEST(FloodTest, InflightBytesBoundMemoryAndEveryRequestIsAnsweredOrRefused) {
  const std::string dir = ::testing::TempDir() + "/flood_test_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::shared_ptr<const MhaModel> model = *MhaModel::Random(testing::SelfAttentionSpec(256, 4), 5);
  testing::WriteModelDir(*model, dir + "/wide");
  testing::ServerProcess server(
      ATTENTION_SERVER_BINARY,
      {"--model_repository=" + dir, "--threads=1", absl::StrCat("--max_inflight_bytes=", kBudget),
       "--max_queue_size=4096", "--max_batch_size=2", "--max_message_bytes=8388608",
       // One request's working memory is about 56 MiB (its padded copy,
       // projections, kernel buffers): a batch of two fits. It was always
       // allocated; the margin below held it before it was counted.
       absl::StrCat("--max_batch_working_bytes=", 128 * kMiB)});
  ASSERT_TRUE(server.ok());

  // One request: 4 MiB of query, 4 MiB of output: 8 MiB of the budget.
  std::mt19937 rng(11);
  const Tensor query = testing::RandomTensor({4, 1024, 256}, rng);
  v1::InferRequest request;
  testing::ToProto(query, request.mutable_query());
  auto engine = MhaEngine::Create(model);
  ASSERT_TRUE(engine.ok());
  MhaInputs inputs;
  inputs.query = query.view();
  auto solo = (*engine)->Forward(inputs);
  ASSERT_TRUE(solo.ok()) << solo.status();
  const Tensor& expected = solo->output;

  auto check = [&](const v1::InferResponse& response) {
    const Tensor got = testing::FromProto(response.output());
    ASSERT_EQ(got.num_elements(), expected.num_elements());
    double worst = 0;
    for (int64_t i = 0; i < got.num_elements(); ++i) {
      worst = std::max<double>(worst, std::abs(got.as<float>()[i] - expected.as<float>()[i]));
    }
    EXPECT_LE(worst, 1e-4);
  };
  auto channel = [&] {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 * kMiB);
    args.SetMaxReceiveMessageSize(64 * kMiB);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // A connection of its own.
    return grpc::CreateCustomChannel(server.target(), grpc::InsecureChannelCredentials(), args);
  };
  // Warm up (heap, primitives), then measure from here.
  auto warm = v1::AttentionService::NewStub(channel());
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    v1::InferResponse response;
    ASSERT_TRUE(warm->Infer(&context, request, &response).ok());
    check(response);
  }
  const int64_t before = ProcStatusBytes(server.pid(), "VmRSS:");
  {  // Reset the peak (VmHWM) to the current RSS.
    std::ofstream clear("/proc/" + std::to_string(server.pid()) + "/clear_refs");
    clear << "5";
  }

  constexpr int kClients = 16, kEach = 6;
  // Refused by the service (the message names the budget), or by gRPC's
  // transport when its quota is spent (RST_STREAM, ENHANCE_YOUR_CALM).
  std::atomic<int> ok{0}, refused{0}, transport_refused{0}, other{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      // Connected before the flood starts: a connection attempt that fails
      // is retried (with gRPC's backoff) rather than failing the calls, and
      // one that cannot be made says why.
      const std::shared_ptr<grpc::Channel> connection = channel();
      if (!connection->WaitForConnected(std::chrono::system_clock::now() +
                                        std::chrono::seconds(30))) {
        ADD_FAILURE() << "cannot connect to the server (channel state "
                      << connection->GetState(false) << "); this process: " << Descriptors(getpid())
                      << "; the server: " << Descriptors(server.pid());
        other += kEach;
        return;
      }
      auto stub = v1::AttentionService::NewStub(connection);
      for (int i = 0; i < kEach; ++i) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
        v1::InferResponse response;
        const grpc::Status status = stub->Infer(&context, request, &response);
        if (status.ok()) {
          check(response);
          ++ok;
        } else if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
                   status.error_message().find("--max_inflight_bytes") != std::string::npos) {
          ++refused;
        } else if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
                   status.error_message().find("RST_STREAM with error code 11") !=
                       std::string::npos) {
          ++transport_refused;
        } else {
          ADD_FAILURE() << status.error_code() << " " << status.error_message();
          ++other;
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  const int64_t peak = ProcStatusBytes(server.pid(), "VmHWM:");
  std::cout << "flood: " << ok << " answered, " << refused << " refused, " << transport_refused
            << " refused by the transport; server RSS before " << before / kMiB << " MiB, peak "
            << peak / kMiB << " MiB (budget " << kBudget / kMiB << " MiB + margin "
            << kMargin / kMiB << " MiB)\n";
  EXPECT_EQ(ok + refused + transport_refused, kClients * kEach);
  EXPECT_EQ(other, 0);
  EXPECT_GT(refused, 0) << "the flood never reached the budget";
  EXPECT_GT(ok, 0);
  EXPECT_LE(peak - before, kBudget + kMargin);

  // Still serving, and nothing left counted in flight.
  grpc::ClientContext context;
  v1::InferResponse response;
  ASSERT_TRUE(warm->Infer(&context, request, &response).ok());
  check(response);
  // A unary call's bytes stay admitted until gRPC is done with the call,
  // which may be a moment after the client has its response.
  std::string metrics = testing::HttpGet(server.metrics_port(), "/metrics");
  for (int i = 0; i < 1000 && testing::MetricValue(metrics, "attention_inflight_bytes", {}) != 0;
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    metrics = testing::HttpGet(server.metrics_port(), "/metrics");
  }
  EXPECT_EQ(testing::MetricValue(metrics, "attention_inflight_bytes", {}), 0);
  EXPECT_EQ(testing::MetricValue(metrics, "attention_inflight_bytes_limit", {}),
            static_cast<double>(kBudget));
  EXPECT_GE(
      testing::MetricValue(metrics, "attention_refusals_total", {"code=\"RESOURCE_EXHAUSTED\""}),
      refused.load());
  EXPECT_EQ(server.Stop(), 0);
}

// gRPC 1.51 stops listening for good when accept4() fails for want of a
// descriptor; the server must close what it cannot accept, say so, and
// accept again once descriptors are free.
TEST(FloodTest, RunningOutOfFileDescriptorsDoesNotStopTheServerAccepting) {
  testing::OneModelProcess setup("fd_flood_test");
  testing::ServerProcessOptions& process = setup.options;
  process.max_open_files = 64;  // Soft and hard: the server cannot raise it.
  testing::ServerProcess server(ATTENTION_SERVER_BINARY, setup.Flags(), "127.0.0.1", 0, process);
  ASSERT_TRUE(server.ok());
  auto log = [&] {
    std::ifstream in(process.stderr_path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  EXPECT_THAT(log(), HasSubstr("file descriptors: limit 64"));

  // Twice as many connections as the server has descriptors, held open
  // (the kernel completes them; the server accepts what it can).
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(server.port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int> held;
  for (int i = 0; i < 128; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0) << "this process: " << Descriptors(getpid());
    ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0)
        << errno;
    held.push_back(fd);
  }
  // The server ran out: it says so (gRPC alone said "Failed accept4" and
  // never accepted again).
  std::string text = log();
  for (int i = 0;
       i < 200 && text.find("refused a connection: no file descriptor left") == std::string::npos &&
       text.find("Failed accept4") == std::string::npos;
       ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    text = log();
  }
  EXPECT_THAT(text, HasSubstr("refused a connection: no file descriptor left to accept it (Too "
                              "many open files;"));
  for (int fd : held) close(fd);

  // Descriptors free again: a new client connects and is served.
  {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto health = grpc::health::v1::Health::NewStub(
        grpc::CreateCustomChannel(server.target(), grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = health->Check(&context, {}, &response);
    EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message()
                             << "; the server: " << Descriptors(server.pid()) << "\n"
                             << log();
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }  // Its connection closed: an idle one would hold the drain.
  EXPECT_EQ(server.Stop(), 0);
}

// CPU seconds process `pid` has used (user and system), from /proc.
double CpuSeconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime.
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The same on the REST port. Asio's acceptor calls accept(), not the
// accept4() the guard replaces: out of descriptors, each accept failed at
// once and was retried at once (an I/O thread spinning at 100%), the
// connections waited in the listen queue unanswered, and nothing was logged.
TEST(FloodTest, RunningOutOfFileDescriptorsOnTheRestPortClosesWhatItCannotAccept) {
  testing::OneModelProcess setup("fd_flood_rest_test");
  testing::ServerProcessOptions& process = setup.options;
  process.max_open_files = 64;
  testing::ServerProcess server(ATTENTION_SERVER_BINARY, setup.Flags(), "127.0.0.1", 0, process);
  ASSERT_TRUE(server.ok());
  ASSERT_GT(server.http_port(), 0);
  auto log = [&] {
    std::ifstream in(process.stderr_path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(server.http_port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int> held;
  for (int i = 0; i < 128; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0) << "this process: " << Descriptors(getpid());
    ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0)
        << errno;
    held.push_back(fd);
  }
  std::string text = log();
  for (int i = 0;
       i < 200 && text.find("refused a connection: no file descriptor left") == std::string::npos;
       ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    text = log();
  }
  EXPECT_THAT(text, HasSubstr("refused a connection: no file descriptor left to accept it"))
      << Descriptors(server.pid());
  // Out of descriptors with connections still arriving, the server waits
  // for descriptors rather than retrying the accept at once: a spinning
  // thread would take about a second of CPU in this second.
  const int extra = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(extra, 0);
  ASSERT_EQ(connect(extra, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  held.push_back(extra);
  const double cpu = CpuSeconds(server.pid());
  absl::SleepFor(absl::Seconds(1));
  EXPECT_LT(CpuSeconds(server.pid()) - cpu, 0.5) << "the REST acceptor spins";
  for (int fd : held) close(fd);
  // Descriptors free again: REST answers.
  std::string live;
  for (int i = 0; i < 100 && live.empty(); ++i) {
    live = testing::HttpGet(server.http_port(), "/v2");
    if (live.empty()) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_THAT(live, HasSubstr("\"name\"")) << log();
  EXPECT_EQ(server.Stop(), 0);
}

}  // namespace
}  // namespace attention
