// The /metrics endpoint of a live server: the attention_* families by model,
// method and code, and the standard process_* metrics, exist and move.
#include <grpcpp/grpcpp.h>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "tests/fixture/server_fixture.h"

namespace attention {
namespace {

using ::attention::testing::HttpGet;
using ::attention::testing::MetricValue;
using ::testing::HasSubstr;

TEST_F(ServerTest, ProcessMetricsAreExposedAndMove) {
  auto value = [this](const std::string& name) {
    return MetricValue(HttpGet(metrics_port_, "/metrics"), name, {});
  };
  const double cpu_before = value("process_cpu_seconds_total");
  // Burn CPU in this process (the server's): a few larger requests.
  auto stub = InProcessStub();
  std::mt19937 rng(12);
  v1::InferRequest request;
  ToProto(RandomTensor({8, 256, 32}, rng), request.mutable_query());
  request.set_model("small");
  for (const absl::Time until = absl::Now() + absl::Milliseconds(300); absl::Now() < until;) {
    ASSERT_TRUE(InferStatus(*stub, request).ok());
  }
  EXPECT_GT(value("process_cpu_seconds_total"), cpu_before);
  EXPECT_GT(value("process_resident_memory_bytes"), 10e6);
  EXPECT_GT(value("process_virtual_memory_bytes"), value("process_resident_memory_bytes"));
  EXPECT_GT(value("process_open_fds"), 3);
  EXPECT_GE(value("process_max_fds"), value("process_open_fds"));
  EXPECT_GT(value("process_threads"), 2);
  const double start = value("process_start_time_seconds");
  EXPECT_GT(start, absl::ToUnixSeconds(absl::Now()) - 3600.0);
  EXPECT_LE(start, absl::ToUnixSeconds(absl::Now()) + 1.0);
}

TEST_F(ServerTest, MetricsAreExposedAndMove) {
  const std::string before = HttpGet(metrics_port_, "/metrics");
  auto stub = InProcessStub();
  std::mt19937 rng(11);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(InferStatus(*stub, MakeCase(rng, i).request).ok());
  const std::string after = HttpGet(metrics_port_, "/metrics");
  for (const char* name :
       {"attention_request_duration_seconds_bucket", "attention_queue_duration_seconds_count",
        "attention_compute_duration_seconds_sum", "attention_batch_size_count",
        "attention_padding_ratio_bucket", "attention_requests_total", "attention_tokens_total",
        "attention_flops_total", "attention_queue_depth", "attention_queue_capacity",
        "attention_inflight_requests", "attention_build_info"}) {
    EXPECT_THAT(after, HasSubstr(name));
  }
  EXPECT_THAT(after, HasSubstr("le=\"5e-05\""));  // Buckets from 50 us ...
  EXPECT_THAT(after, HasSubstr("le=\"10\""));     // ... to 10 s.
  const std::vector<std::string> ok = {"model=\"small\"", "method=\"Infer\"", "code=\"OK\""};
  EXPECT_GE(MetricValue(after, "attention_requests_total", ok),
            MetricValue(before, "attention_requests_total", ok) + 3);
  const std::vector<std::string> small = {"model=\"small\""};
  EXPECT_GT(MetricValue(after, "attention_tokens_total", small),
            MetricValue(before, "attention_tokens_total", small));
  EXPECT_GT(MetricValue(after, "attention_flops_total", small),
            MetricValue(before, "attention_flops_total", small));
  EXPECT_GT(MetricValue(after, "attention_request_duration_seconds_count", small),
            MetricValue(before, "attention_request_duration_seconds_count", small));
  EXPECT_EQ(MetricValue(after, "attention_build_info", {"version=\""}), 1);
  EXPECT_EQ(MetricValue(after, "attention_queue_capacity", {"model=\"tiny_queue\""}), 2);
}

}  // namespace
}  // namespace attention
