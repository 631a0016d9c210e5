// Memory on the gRPC receive path (issue 33, item 7): ModelStreamInfer
// streams that send large messages the service refuses at once (an unknown
// model, a 30 MiB request id) and do not read their answers. The server
// process's RSS must stay within its memory plan's receive figures
// (max_inflight_bytes, grpc_receive_quota_bytes, and the allocator_reserve
// of freed memory malloc may keep) plus a stated slack, and fall back within
// the reserve once the flood is over.
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/mha_model.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_util.h"
#include "tests/memory/one_model_process.h"

namespace attention {
namespace {

using testing::ProcStatusBytes;

constexpr int64_t kMiB = 1 << 20;

// The bytes of line `name` of the memory plan's table in `log` (-1 if none).
int64_t PlanLine(const std::string& log, const std::string& name) {
  std::smatch match;
  if (!std::regex_search(log, match, std::regex("\n  " + name + " +([0-9]+) bytes"))) return -1;
  return std::stoll(match[1]);
}

TEST(ReceiveMemoryTest, RefusedLargeMessagesOnUnreadStreamsStayWithinThePlan) {
  testing::OneModelProcess setup("receive_memory");
  const testing::ServerProcessOptions& process = setup.options;
  // The flags, under a stated limit so that the plan's allocator
  // reserve does not depend on the machine (about 40 MiB).
  testing::ServerProcess server(ATTENTION_SERVER_BINARY,
                                setup.Flags({absl::StrCat("--max_inflight_bytes=", 32 * kMiB),
                                             absl::StrCat("--memory_limit_bytes=", 512 * kMiB)}),
                                "127.0.0.1", 0, process);
  ASSERT_TRUE(server.ok());
  std::string log;
  {
    std::ifstream in(process.stderr_path);
    log.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const int64_t inflight = PlanLine(log, "max_inflight_bytes");
  const int64_t quota = PlanLine(log, "grpc_receive_quota_bytes");
  const int64_t reserve = PlanLine(log, "allocator_reserve");
  ASSERT_EQ(inflight, 32 * kMiB) << log;
  ASSERT_EQ(quota, 128 * kMiB) << log;
  ASSERT_GT(reserve, 0) << log;

  constexpr int kStreams = 10, kEach = 12;
  constexpr int64_t kIdBytes = 30 * kMiB;
  // Beyond the plan's figures: the parsed copy of each message being
  // handled, one per gRPC callback thread (gRPC 1.51 runs
  // clamp(cores / 2, 2, 16) of them), and 16 MiB of heap and gRPC overhead.
  const int64_t callback_threads =
      std::clamp<int64_t>(std::thread::hardware_concurrency() / 2, 2, 16);
  const int64_t slack = callback_threads * kIdBytes + 16 * kMiB;
  inference::ModelInferRequest request;
  request.set_model_name("no_such_model");
  request.set_id(std::string(kIdBytes, 'x'));

  const int64_t before = ProcStatusBytes(server.pid(), "VmRSS:");
  {  // Reset the peak (VmHWM) to the current RSS.
    std::ofstream clear("/proc/" + std::to_string(server.pid()) + "/clear_refs");
    clear << "5";
  }
  struct Stream {
    std::unique_ptr<inference::GRPCInferenceService::Stub> stub;
    grpc::ClientContext context;
    std::unique_ptr<
        grpc::ClientReaderWriter<inference::ModelInferRequest, inference::ModelStreamInferResponse>>
        call;
    int written = 0;
  };
  std::vector<std::unique_ptr<Stream>> streams;
  for (int s = 0; s < kStreams; ++s) {
    auto stream = std::make_unique<Stream>();
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // A connection of its own.
    stream->stub = inference::GRPCInferenceService::NewStub(
        grpc::CreateCustomChannel(server.target(), grpc::InsecureChannelCredentials(), args));
    stream->call = stream->stub->ModelStreamInfer(&stream->context);
    streams.push_back(std::move(stream));
  }
  // Every stream sends all its requests before any answer is read. A write
  // fails only when gRPC cancels the stream at its quota (RST_STREAM).
  std::vector<std::thread> writers;
  for (auto& stream : streams) {
    writers.emplace_back([&request, s = stream.get()] {
      while (s->written < kEach && s->call->Write(request)) ++s->written;
    });
  }
  for (std::thread& t : writers) t.join();
  const int64_t peak = ProcStatusBytes(server.pid(), "VmHWM:");

  // Every request the server read is refused naming the model; a stream
  // ends OK, or is cut by gRPC at its quota.
  int refused = 0, cut = 0;
  for (auto& stream : streams) {
    stream->call->WritesDone();
    inference::ModelStreamInferResponse response;
    while (stream->call->Read(&response)) {
      EXPECT_NE(response.error_message().find("no_such_model"), std::string::npos)
          << response.error_message();
      EXPECT_EQ(response.infer_response().id().size(), 1024u);  // Echoed cut to the limit.
      ++refused;
    }
    const grpc::Status status = stream->call->Finish();
    if (!status.ok()) {
      // The stream (RST_STREAM) or its whole connection (the write side then
      // sees a broken pipe) ended by gRPC at its quota.
      const bool stream_cut = status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
                              absl::StrContains(status.error_message(), "RST_STREAM");
      EXPECT_TRUE(stream_cut || status.error_code() == grpc::StatusCode::UNAVAILABLE)
          << status.error_code() << " " << status.error_message();
      ++cut;
    } else {
      EXPECT_EQ(stream->written, kEach);
    }
  }
  EXPECT_GT(refused, 0) << "no request reached the server";

  // Once the flood is over, malloc keeps at most the reserve (the trimmer
  // checks every 100 ms), beside 16 MiB of gRPC's and the heap's own.
  int64_t rest = ProcStatusBytes(server.pid(), "VmRSS:");
  for (int i = 0; i < 100 && rest - before > reserve + 16 * kMiB; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    rest = ProcStatusBytes(server.pid(), "VmRSS:");
  }
  std::cout << kStreams << " streams x " << kEach << " requests of " << kIdBytes / kMiB << " MiB ("
            << refused << " refused, " << cut << " streams cut by gRPC): server RSS "
            << before / kMiB << " MiB before, peak " << peak / kMiB << " MiB (+"
            << (peak - before) / kMiB << " MiB; plan: max_inflight_bytes " << inflight / kMiB
            << " + grpc_receive_quota_bytes " << quota / kMiB << " + allocator_reserve "
            << reserve / kMiB << " MiB, slack " << slack / kMiB << " MiB), at rest " << rest / kMiB
            << " MiB (+" << (rest - before) / kMiB << " MiB)\n";
  EXPECT_LE(peak - before, inflight + quota + reserve + slack);
  EXPECT_LE(rest - before, reserve + 16 * kMiB);

  streams.clear();  // Idle connections would hold the drain.
  EXPECT_EQ(server.Stop(), 0);
}

}  // namespace
}  // namespace attention
