// The client's deadline on REST (issue 35): `grpc-timeout`, as gRPC sends
// it, sets the call's deadline; a request still queued when it passes is
// answered DEADLINE_EXCEEDED (504) uncomputed and counted as gRPC counts
// it; a malformed value is 400 naming the header. (Before: the header was
// ignored, and the request waited and was computed.)
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "tests/fixture/http_test_client.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::testing::HttpTestHeaders;
using ::testing::HasSubstr;

class RestDeadlineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::ModelFolder models("rest_deadline");
    models.Add("small", testing::SelfAttentionSpec(16, 2), 1);
    // Queued for up to 20 s for company: a request alone waits there.
    models.Add("held", testing::SelfAttentionSpec(16, 2), 1,
               "\"max_batch_size\": 16, \"max_queue_delay_us\": 20000000");
    path_ = new std::string(models.path());
    server_ =
        testing::StartServer(testing::TestServerOptions(models.path(), /*rest=*/true)).release();
    ASSERT_NE(server_, nullptr);
  }
  static void TearDownTestSuite() {
    delete server_;  // Answers what is still queued.
    std::filesystem::remove_all(*path_);
    delete path_;
  }
  static testing::HttpTestResult Infer(const std::string& model, const HttpTestHeaders& headers) {
    std::string data = "0";
    for (int i = 1; i < 16; ++i) data += ",0";
    testing::HttpTestClient client("127.0.0.1", server_->http_port());
    client.SetTimeout(absl::Seconds(30));
    return client.Post(
        absl::StrCat("/v2/models/", model, "/infer"), headers,
        absl::StrCat(R"({"inputs":[{"name":"query","datatype":"FP32","shape":[1,1,16],"data":[)",
                     data, "]}]}"),
        "application/json");
  }
  static int64_t Count(const std::string& model, absl::StatusCode code) {
    const server::ModelMetrics& m = *server_->repository()->Find(model)->metrics;
    return m.requests[static_cast<int>(server::Method::kRestModelInfer)][static_cast<int>(code)]
        ->Value();
  }

  static inline std::string* path_ = nullptr;
  static inline server::AttentionServer* server_ = nullptr;
};

TEST_F(RestDeadlineTest, ARequestQueuedPastItsDeadlineIsAnsweredDeadlineExceededUncomputed) {
  // 50 ms of a 20 s wait for company: the batcher drops it at its deadline.
  const auto res = Infer("held", {{"grpc-timeout", "50m"}});
  ASSERT_TRUE(res) << res.error();
  EXPECT_EQ(res->status, 504) << res->body;  // HttpStatusOf(DEADLINE_EXCEEDED).
  EXPECT_THAT(res->body, HasSubstr("not computed"));
  EXPECT_EQ(Count("held", absl::StatusCode::kDeadlineExceeded), 1);
  EXPECT_EQ(Count("held", absl::StatusCode::kOk), 0);
  // A deadline the request meets changes nothing.
  const auto met = Infer("small", {{"grpc-timeout", "30S"}});
  ASSERT_TRUE(met) << met.error();
  EXPECT_EQ(met->status, 200) << met->body;
}

TEST_F(RestDeadlineTest, AMalformedTimeoutIsRefusedNamingTheHeaderAndItsForm) {
  const int64_t computed = Count("small", absl::StatusCode::kOk);
  for (const char* value : {"", "50", "m", "abc", "5x", "-5S", "1.5S", "123456789S", "5 S"}) {
    SCOPED_TRACE(value);
    const auto res = Infer("small", {{"grpc-timeout", value}});
    ASSERT_TRUE(res) << res.error();
    EXPECT_EQ(res->status, 400) << res->body;
    EXPECT_THAT(res->body, HasSubstr("grpc-timeout: expected 1 to 8 digits and a unit"));
  }
  EXPECT_EQ(Count("small", absl::StatusCode::kOk), computed) << "a refused request was computed";
}

}  // namespace
}  // namespace attention
