// attention.v1.SessionService end to end (in process, over loopback gRPC):
// appends against one stateless Infer over the whole sequence, cross
// sessions, ordering on a stream, batching, errors that leave a session
// unchanged, expiry, metrics and memory accounting. Eviction, drain and the
// port: server_session_lifecycle_test.cc.
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "absl/synchronization/mutex.h"

#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/session_test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

class SessionTest : public SessionServerTest {
 protected:
  static void SetUpTestSuite() { StartSuiteServer("session_test"); }

  static std::unique_ptr<v1::SessionService::Stub> Sessions(server::AttentionServer* s = server_) {
    return v1::SessionService::NewStub(s->InProcessChannel());
  }
  static std::unique_ptr<v1::AttentionService::Stub> Attention() {
    return v1::AttentionService::NewStub(server_->InProcessChannel());
  }

  static std::string Create(v1::SessionService::Stub& stub, const std::string& model = "small") {
    grpc::ClientContext context;
    v1::CreateSessionRequest request;
    request.set_model(model);
    request.set_kind(v1::SESSION_KIND_SELF);
    v1::SessionInfo info;
    const grpc::Status status = stub.CreateSession(&context, request, &info);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(info.session_id().size(), 32u);  // 128 random bits in hex.
    return info.session_id();
  }

  static grpc::Status Append(v1::SessionService::Stub& stub, const std::string& id,
                             const Tensor& tokens, v1::AppendResponse* response,
                             const Tensor* not_key = nullptr, bool need_weights = false) {
    grpc::ClientContext context;
    v1::AppendRequest request;
    request.set_session_id(id);
    ToProto(tokens, request.mutable_tokens());
    if (not_key != nullptr) ToProto(*not_key, request.mutable_not_key());
    request.set_need_weights(need_weights);
    return stub.Append(&context, request, response);
  }

  // Rows [from, from + count) of a (T, F) tensor.
  static Tensor Rows(const Tensor& t, int64_t from, int64_t count) {
    const int64_t f = t.dim(1);
    return Tensor::FromBytes(t.dtype(), {count, f},
                             static_cast<const char*>(t.data()) + from * f * DTypeSize(t.dtype()));
  }

  // One stateless Infer over the whole sequence with is_causal and the
  // not-a-key flags as key_padding_mask: what every append must match.
  static v1::InferResponse Stateless(const Tensor& x, const Tensor* not_key, bool weights) {
    grpc::ClientContext context;
    v1::InferRequest request;
    request.set_model("small");
    ToProto(x, request.mutable_query());
    if (not_key != nullptr) ToProto(*not_key, request.mutable_key_padding_mask());
    request.set_is_causal(true);
    request.set_need_weights(weights);
    v1::InferResponse response;
    EXPECT_TRUE(Attention()->Infer(&context, request, &response).ok());
    return response;
  }

  static void ExpectRowsNear(const Tensor& got, const Tensor& want, int64_t want_row, double tol) {
    const int64_t f = got.dim(1);
    for (int64_t i = 0; i < got.dim(0); ++i) {
      for (int64_t j = 0; j < f; ++j) {
        ASSERT_NEAR(got.as<float>()[i * f + j], want.as<float>()[(want_row + i) * f + j], tol)
            << "row " << want_row + i << " column " << j;
      }
    }
  }
};

TEST_F(SessionTest, ChunkedAppendsEqualOneStatelessCausalInfer) {
  std::mt19937 rng(7);
  const int64_t t = 40;
  const Tensor x = RandomTensor({t, kE}, rng);
  Tensor not_key = RandomMask({t}, rng, 0.2);
  not_key.mutable_as<bool>()[0] = false;
  const v1::InferResponse whole = Stateless(x, &not_key, /*weights=*/true);
  const Tensor want = FromProto(whole.output());
  const Tensor want_weights = FromProto(whole.attn_weights());  // (T, T) averaged.
  auto stub = Sessions();
  const std::string id = Create(*stub);
  int64_t at = 0;
  for (int64_t chunk : {1, 3, 1, 7, 16, 2, 10}) {
    v1::AppendResponse response;
    const Tensor part = Rows(x, at, chunk);
    const Tensor flags = Tensor::FromBytes(DType::kBool, {chunk}, not_key.as<bool>() + at);
    ASSERT_TRUE(Append(*stub, id, part, &response, &flags, /*need_weights=*/true).ok());
    EXPECT_EQ(response.length(), at + chunk);
    const Tensor out = FromProto(response.output());
    ASSERT_EQ(out.shape(), (Shape{chunk, kE}));
    ExpectRowsNear(out, want, at, 1e-5);
    // Weights over the keys held so far: the stateless rows' first columns.
    const Tensor w = FromProto(response.attn_weights());
    ASSERT_EQ(w.shape(), (Shape{chunk, at + chunk}));
    for (int64_t i = 0; i < chunk; ++i) {
      for (int64_t j = 0; j < at + chunk; ++j) {
        ASSERT_NEAR(w.as<float>()[i * (at + chunk) + j], want_weights.as<float>()[(at + i) * t + j],
                    1e-6);
      }
    }
    at += chunk;
  }
  v1::GetSessionRequest get;
  get.set_session_id(id);
  v1::SessionInfo info;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->GetSession(&context, get, &info).ok());
  EXPECT_EQ(info.length(), t);
  EXPECT_EQ(info.keys(), t);
  EXPECT_GT(info.bytes(), 0);
  EXPECT_EQ(info.max_tokens(), 64);
}

TEST_F(SessionTest, CrossSessionEqualsStatelessInferWithFixedKeys) {
  std::mt19937 rng(8);
  const Tensor q = RandomTensor({9, 16}, rng), k = RandomTensor({13, 12}, rng),
               v = RandomTensor({13, 10}, rng), kpm = RandomMask({13}, rng, 0.3);
  v1::InferResponse whole;
  {
    grpc::ClientContext context;
    v1::InferRequest request;
    request.set_model("cross");
    ToProto(q, request.mutable_query());
    ToProto(k, request.mutable_key());
    ToProto(v, request.mutable_value());
    ToProto(kpm, request.mutable_key_padding_mask());
    ASSERT_TRUE(Attention()->Infer(&context, request, &whole).ok());
  }
  auto stub = Sessions();
  v1::SessionInfo info;
  {
    grpc::ClientContext context;
    v1::CreateSessionRequest request;
    request.set_model("cross");
    request.set_kind(v1::SESSION_KIND_CROSS);
    ToProto(k, request.mutable_key());
    ToProto(v, request.mutable_value());
    ToProto(kpm, request.mutable_key_padding_mask());
    const grpc::Status status = stub->CreateSession(&context, request, &info);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(info.kind(), v1::SESSION_KIND_CROSS);
  EXPECT_EQ(info.keys(), 13);
  const Tensor want = FromProto(whole.output());
  int64_t at = 0;
  for (int64_t chunk : {4, 1, 4}) {
    v1::AppendResponse response;
    ASSERT_TRUE(Append(*stub, info.session_id(), Rows(q, at, chunk), &response).ok());
    ExpectRowsNear(FromProto(response.output()), want, at, 1e-5);
    at += chunk;
    EXPECT_EQ(response.length(), at);
  }
}

TEST_F(SessionTest, AppendsOnAStreamAreAppliedInOrder) {
  std::mt19937 rng(9);
  const int64_t t = 24;
  const Tensor x = RandomTensor({t, kE}, rng);
  const Tensor want = FromProto(Stateless(x, nullptr, false).output());
  auto stub = Sessions();
  const std::string id = Create(*stub);
  grpc::ClientContext context;
  auto stream = stub->SessionStream(&context);
  for (int64_t i = 0; i < t; ++i) {  // All sent before any response is read.
    v1::AppendRequest request;
    request.set_session_id(id);
    request.set_request_id("step" + std::to_string(i));
    ToProto(Rows(x, i, 1), request.mutable_tokens());
    ASSERT_TRUE(stream->Write(request));
  }
  stream->WritesDone();
  v1::AppendResponse response;
  for (int64_t i = 0; i < t; ++i) {
    ASSERT_TRUE(stream->Read(&response));
    ASSERT_FALSE(response.has_error()) << response.error().message();
    EXPECT_EQ(response.request_id(), "step" + std::to_string(i));
    EXPECT_EQ(response.session_id(), id);
    EXPECT_EQ(response.length(), i + 1);
    ExpectRowsNear(FromProto(response.output()), want, i, 1e-5);
  }
  EXPECT_FALSE(stream->Read(&response));
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(SessionTest, ConcurrentSessionsShareBatchesAndMatchSoloRuns) {
  std::mt19937 rng(10);
  constexpr int kSessions = 12;
  constexpr int64_t kSteps = 6;
  std::vector<Tensor> xs;
  for (int s = 0; s < kSessions; ++s) xs.push_back(RandomTensor({kSteps, kE}, rng));
  auto run = [&](bool together, int* max_batch) {
    std::vector<std::vector<float>> outputs(kSessions);
    auto one = [&](int s) {
      auto stub = Sessions();
      const std::string id = Create(*stub);
      for (int64_t i = 0; i < kSteps; ++i) {
        v1::AppendResponse response;
        ASSERT_TRUE(Append(*stub, id, Rows(xs[s], i, 1), &response).ok());
        *max_batch = std::max(*max_batch, response.batch_requests());
        const Tensor out = FromProto(response.output());
        outputs[s].insert(outputs[s].end(), out.as<float>(), out.as<float>() + kE);
      }
    };
    if (together) {
      std::vector<std::thread> threads;
      for (int s = 0; s < kSessions; ++s) threads.emplace_back(one, s);
      for (auto& th : threads) th.join();
    } else {
      for (int s = 0; s < kSessions; ++s) one(s);
    }
    return outputs;
  };
  int batched = 0, solo = 0;
  const auto together = run(true, &batched);
  const auto alone = run(false, &solo);
  EXPECT_GT(batched, 1) << "concurrent appends never shared a batch";
  EXPECT_EQ(solo, 1);
  for (int s = 0; s < kSessions; ++s) {
    ASSERT_EQ(together[s].size(), alone[s].size());
    for (size_t i = 0; i < together[s].size(); ++i) {
      ASSERT_NEAR(together[s][i], alone[s][i], 1e-6) << "session " << s << " element " << i;
    }
  }
}

TEST_F(SessionTest, FailedAppendsLeaveTheSessionUnchanged) {
  std::mt19937 rng(11);
  const Tensor x = RandomTensor({5, kE}, rng);
  const Tensor want = FromProto(Stateless(x, nullptr, false).output());
  auto stub = Sessions();
  const std::string id = Create(*stub);
  v1::AppendResponse response;
  ASSERT_TRUE(Append(*stub, id, Rows(x, 0, 2), &response).ok());
  // Wrong feature count: INVALID_ARGUMENT naming the field.
  grpc::Status status = Append(*stub, id, RandomTensor({1, kE + 1}, rng), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("tokens"));
  // Past max_session_tokens (64): FAILED_PRECONDITION.
  status = Append(*stub, id, RandomTensor({63, kE}, rng), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("max_session_tokens 64"));
  // not_key of the wrong length.
  const Tensor flags = RandomMask({2}, rng, 0.5);
  status = Append(*stub, id, Rows(x, 2, 3), &response, &flags);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("not_key"));
  // The session goes on as if those never happened.
  ASSERT_TRUE(Append(*stub, id, Rows(x, 2, 3), &response).ok());
  EXPECT_EQ(response.length(), 5);
  ExpectRowsNear(FromProto(response.output()), want, 2, 1e-5);
}

TEST_F(SessionTest, NotFoundSaysWhy) {
  const server::ModelMetrics& metrics = *server_->repository()->Find("small")->metrics;
  const double closed_before = metrics.session_ends[0]->Value();
  const double expired_before = metrics.session_ends[1]->Value();
  auto stub = Sessions();
  v1::AppendResponse response;
  std::mt19937 rng(12);
  const Tensor token = RandomTensor({1, kE}, rng);
  grpc::Status status = Append(*stub, "00000000000000000000000000000000", token, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("not known to this server"));
  const std::string id = Create(*stub);
  {
    grpc::ClientContext context;
    v1::CloseSessionRequest close;
    close.set_session_id(id);
    v1::CloseSessionResponse closed;
    ASSERT_TRUE(stub->CloseSession(&context, close, &closed).ok());
  }
  status = Append(*stub, id, token, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("was closed"));
  // Expiry: a one-second TTL, polled (the reaper runs every second).
  v1::SessionInfo info;
  {
    grpc::ClientContext context;
    v1::CreateSessionRequest request;
    request.set_kind(v1::SESSION_KIND_SELF);
    request.set_ttl_s(1);
    ASSERT_TRUE(stub->CreateSession(&context, request, &info).ok());
  }
  grpc::Status get;
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext context;
    v1::GetSessionRequest request;
    request.set_session_id(info.session_id());
    v1::SessionInfo now;
    get = stub->GetSession(&context, request, &now);
    if (!get.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(get.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(get.error_message(), HasSubstr("expired after 1s idle"));
  EXPECT_EQ(metrics.session_ends[0]->Value(), closed_before + 1);   // closed
  EXPECT_EQ(metrics.session_ends[1]->Value(), expired_before + 1);  // expired
}

// An append whose deadline passes before its batch computes is answered
// DEADLINE_EXCEEDED and never applied; then the session goes on.
TEST_F(SessionTest, ExpiredAppendIsNotApplied) {
  std::mt19937 rng(15);
  const Tensor x = RandomTensor({3, kE}, rng);
  const Tensor want = FromProto(Stateless(x, nullptr, false).output());
  auto stub = Sessions();
  const std::string id = Create(*stub);
  v1::AppendResponse response;
  ASSERT_TRUE(Append(*stub, id, Rows(x, 0, 1), &response).ok());
  grpc::Status late;
  {
    absl::MutexLock hold(server_->repository()->compute_mutex());  // No batch computes.
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    v1::AppendRequest request;
    request.set_session_id(id);
    ToProto(RandomTensor({1, kE}, rng), request.mutable_tokens());
    late = stub->Append(&context, request, &response);
  }
  EXPECT_EQ(late.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The batcher drops or refuses it once it runs; either way the session
  // still holds one token, and the next append is row 1 of the sequence.
  ASSERT_TRUE(Append(*stub, id, Rows(x, 1, 2), &response).ok());
  EXPECT_EQ(response.length(), 3);
  ExpectRowsNear(FromProto(response.output()), want, 1, 1e-5);
}

TEST_F(SessionTest, LiveSessionsAndTokensAreCounted) {
  const server::ModelMetrics& metrics = *server_->repository()->Find("small")->metrics;
  auto stub = Sessions();
  const double live = metrics.sessions->Value(), tokens = metrics.session_tokens->Value();
  const std::string id = Create(*stub);
  EXPECT_EQ(metrics.sessions->Value(), live + 1);
  std::mt19937 rng(16);
  v1::AppendResponse response;
  ASSERT_TRUE(Append(*stub, id, RandomTensor({5, kE}, rng), &response).ok());
  EXPECT_EQ(metrics.session_tokens->Value(), tokens + 5);
  EXPECT_GT(server_->metrics().session_memory_bytes().Value(), 0);
  EXPECT_EQ(server_->metrics().session_memory_capacity_bytes().Value(), 64 << 20);
  grpc::ClientContext context;
  v1::CloseSessionRequest close;
  close.set_session_id(id);
  v1::CloseSessionResponse closed;
  ASSERT_TRUE(stub->CloseSession(&context, close, &closed).ok());
  EXPECT_EQ(metrics.sessions->Value(), live);
}

TEST_F(SessionTest, MemoryIsExactlyAccountedOverManyCycles) {
  auto stub = Sessions();
  std::mt19937 rng(13);
  const Tensor x = RandomTensor({40, kE}, rng);
  const server::SessionModel& small =
      *server_->sessions()->model(server_->repository()->Find("small").get());
  const size_t used_before = small.pool->used_bytes();
  const double mapped_before = server_->metrics().session_memory_bytes().Value();
  std::uniform_int_distribution<int64_t> length(1, 40);
  for (int i = 0; i < 1000; ++i) {
    const std::string id = Create(*stub);
    v1::AppendResponse response;
    ASSERT_TRUE(Append(*stub, id, Rows(x, 0, length(rng)), &response).ok());
    grpc::ClientContext context;
    v1::CloseSessionRequest close;
    close.set_session_id(id);
    v1::CloseSessionResponse closed;
    ASSERT_TRUE(stub->CloseSession(&context, close, &closed).ok());
    EXPECT_GT(closed.freed_bytes(), 0);
  }
  // Back to what the other tests' sessions hold.
  EXPECT_EQ(small.pool->used_bytes(), used_before);
  EXPECT_EQ(server_->metrics().session_memory_bytes().Value(), mapped_before);
}

}  // namespace
}  // namespace attention
