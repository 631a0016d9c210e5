// SessionClient::AppendResending against a fake SessionService whose Append
// calls are cut (UNAVAILABLE) on cue, before or after the append is applied:
// a cut append is sent again and applied once; one applied whose answer was
// lost is DATA_LOSS, not applied twice; no resend without expected_length or
// after another error; and it gives up after kMaxResends.
#include "client/cli/session_client.h"

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace attention::client {
namespace {

enum class Cut { kBeforeApplying, kAfterApplying };

// One session ("s") whose length follows the appends applied.
class FakeSessions final : public v1::SessionService::Service {
 public:
  explicit FakeSessions(std::deque<Cut> cuts) : cuts_(std::move(cuts)) {}

  grpc::Status Append(grpc::ServerContext*, const v1::AppendRequest* request,
                      v1::AppendResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    std::optional<Cut> cut;
    if (!cuts_.empty()) {
      cut = cuts_.front();
      cuts_.pop_front();
    }
    const grpc::Status cut_status(grpc::StatusCode::UNAVAILABLE, "connection closed (test)");
    if (cut == Cut::kBeforeApplying) return cut_status;
    if (request->expected_length() != length_) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("expected_length: the session holds ", length_,
                       " tokens, the append expected ", request->expected_length()));
    }
    length_ += request->tokens().shape(0);
    if (cut == Cut::kAfterApplying) return cut_status;
    response->set_length(length_);
    return grpc::Status::OK;
  }

  grpc::Status GetSession(grpc::ServerContext*, const v1::GetSessionRequest* request,
                          v1::SessionInfo* info) override {
    absl::MutexLock lock(&mu_);
    info->set_session_id(request->session_id());
    info->set_length(length_);
    return grpc::Status::OK;
  }

  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  int64_t length() {
    absl::MutexLock lock(&mu_);
    return length_;
  }

 private:
  absl::Mutex mu_;
  std::deque<Cut> cuts_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t length_ ABSL_GUARDED_BY(mu_) = 0;
};

class AppendResendingTest : public ::testing::Test {
 protected:
  void Start(std::deque<Cut> cuts) {
    fake_ = std::make_unique<FakeSessions>(std::move(cuts));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(fake_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<SessionClient>("127.0.0.1:" + std::to_string(port), "", 10000);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // An append of two tokens at `expected_length` (absent if negative).
  static v1::AppendRequest Request(int64_t expected_length) {
    v1::AppendRequest request;
    request.set_session_id("s");
    if (expected_length >= 0) request.set_expected_length(expected_length);
    request.mutable_tokens()->add_shape(2);
    request.mutable_tokens()->add_shape(4);
    return request;
  }

  std::unique_ptr<FakeSessions> fake_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<SessionClient> client_;
};

TEST_F(AppendResendingTest, AnAppendCutBeforeBeingAppliedIsSentAgainAndAppliedOnce) {
  Start({Cut::kBeforeApplying, Cut::kBeforeApplying});
  int resends = 0;
  auto response = client_->AppendResending(Request(0), &resends);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->length(), 2);
  EXPECT_EQ(resends, 2);
  EXPECT_EQ(fake_->calls(), 3);
  EXPECT_EQ(fake_->length(), 2);
}

TEST_F(AppendResendingTest, AnAppendAppliedWhoseAnswerWasLostIsDataLossNotAppliedTwice) {
  Start({Cut::kAfterApplying});
  int resends = 0;
  auto response = client_->AppendResending(Request(0), &resends);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kDataLoss) << response.status();
  EXPECT_EQ(resends, 1);
  EXPECT_EQ(fake_->length(), 2);
  // The session is intact: the next append goes on.
  auto next = client_->AppendResending(Request(2));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->length(), 4);
}

TEST_F(AppendResendingTest, NothingIsSentAgainWithoutExpectedLengthOrAfterAnotherError) {
  Start({Cut::kBeforeApplying});
  EXPECT_EQ(client_->AppendResending(Request(-1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fake_->calls(), 0);
  EXPECT_EQ(client_->Append(Request(0)).status().code(), absl::StatusCode::kUnavailable);
  int resends = 0;
  EXPECT_EQ(client_->AppendResending(Request(5), &resends).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(resends, 0);
  EXPECT_EQ(fake_->calls(), 2);
}

TEST_F(AppendResendingTest, GivesUpAfterMaxResends) {
  Start(std::deque<Cut>(10, Cut::kBeforeApplying));
  int resends = 0;
  EXPECT_EQ(client_->AppendResending(Request(0), &resends).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(resends, SessionClient::kMaxResends);
  EXPECT_EQ(fake_->calls(), 1 + SessionClient::kMaxResends);
  EXPECT_EQ(fake_->length(), 0);
}

}  // namespace
}  // namespace attention::client
