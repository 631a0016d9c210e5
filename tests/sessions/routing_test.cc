// Routing sessions through a gateway, in process: the x-attention-session
// key's rules (characters, length, one live session per key, an idempotent
// CreateSession retry), the id carrying the key and every call having to
// carry it (the message says what to add), expected_length on Append and
// on SessionStream (a mismatch is FAILED_PRECONDITION and the session is
// unchanged), and the inference protocol's `expected_length` parameter on
// sequences. tests/scale_out/gateway_test.cc runs the same through nginx and HAProxy.
#include <grpcpp/grpcpp.h>

#include <random>
#include <string>

#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/attention_server.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/session_test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::testing::StartsWith;

constexpr char kHeader[] = "x-attention-session";

class SessionRoutingTest : public SessionServerTest {
 protected:
  static void SetUpTestSuite() { StartSuiteServer("session_routing_test"); }
  void SetUp() override { stub_ = v1::SessionService::NewStub(server_->InProcessChannel()); }

  // A context with the routing header set to `key` (none for nullptr).
  static void Route(grpc::ClientContext* context, const char* key) {
    if (key != nullptr) context->AddMetadata(kHeader, key);
  }

  grpc::Status Create(const char* key, v1::SessionInfo* info, const std::string& model = "small") {
    grpc::ClientContext context;
    Route(&context, key);
    v1::CreateSessionRequest request;
    request.set_model(model);
    request.set_kind(v1::SESSION_KIND_SELF);
    return stub_->CreateSession(&context, request, info);
  }

  grpc::Status Append(const std::string& id, const char* key, const Tensor& tokens,
                      std::optional<int64_t> expected, v1::AppendResponse* response) {
    grpc::ClientContext context;
    Route(&context, key);
    v1::AppendRequest request;
    request.set_session_id(id);
    ToProto(tokens, request.mutable_tokens());
    if (expected) request.set_expected_length(*expected);
    return stub_->Append(&context, request, response);
  }

  grpc::Status Get(const std::string& id, const char* key, v1::SessionInfo* info) {
    grpc::ClientContext context;
    Route(&context, key);
    v1::GetSessionRequest request;
    request.set_session_id(id);
    return stub_->GetSession(&context, request, info);
  }

  // One stateless causal Infer over `x`: every append's rows must match it.
  static Tensor Stateless(const Tensor& x) {
    auto attention = v1::AttentionService::NewStub(server_->InProcessChannel());
    grpc::ClientContext context;
    v1::InferRequest request;
    request.set_model("small");
    ToProto(x, request.mutable_query());
    request.set_is_causal(true);
    v1::InferResponse response;
    EXPECT_TRUE(attention->Infer(&context, request, &response).ok());
    return FromProto(response.output());
  }

  static Tensor Rows(const Tensor& t, int64_t from, int64_t count) {
    return Tensor::FromBytes(t.dtype(), {count, t.dim(1)},
                             static_cast<const char*>(t.data()) + from * t.dim(1) * 4);
  }

  static void ExpectRows(const v1::Tensor& got_proto, const Tensor& want, int64_t from) {
    const Tensor got = FromProto(got_proto);
    for (int64_t i = 0; i < got.num_elements(); ++i) {
      ASSERT_NEAR(got.as<float>()[i], want.as<float>()[from * kE + i], 1e-5) << "value " << i;
    }
  }

  std::unique_ptr<v1::SessionService::Stub> stub_;
};

TEST_F(SessionRoutingTest, TheIdCarriesTheKeyAndEveryCallMustCarryIt) {
  v1::SessionInfo info;
  ASSERT_TRUE(Create("key-1_A", &info).ok());
  const std::string& id = info.session_id();
  EXPECT_EQ(id.size(), 32u + 1 + 7);
  EXPECT_EQ(id.substr(32), ".key-1_A");
  std::mt19937 rng(1);
  const Tensor x = RandomTensor({4, kE}, rng);
  v1::AppendResponse response;
  // Without the header: INVALID_ARGUMENT saying which header and value to add.
  grpc::Status status = Append(id, nullptr, x, 0, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), StartsWith("x-attention-session: session '"));
  EXPECT_THAT(status.error_message(),
              HasSubstr("carry the metadata header 'x-attention-session: key-1_A'"));
  EXPECT_THAT(status.error_message(), HasSubstr("this call has none"));
  status = Append(id, "key-2", x, 0, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("this call carries 'key-2'"));
  status = Get(id, nullptr, &info);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  {
    grpc::ClientContext context;
    v1::CloseSessionRequest close;
    close.set_session_id(id);
    v1::CloseSessionResponse closed;
    EXPECT_EQ(stub_->CloseSession(&context, close, &closed).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Nothing was applied; with the header every call works.
  ASSERT_TRUE(Get(id, "key-1_A", &info).ok());
  EXPECT_EQ(info.length(), 0);
  ASSERT_TRUE(Append(id, "key-1_A", x, 0, &response).ok());
  EXPECT_EQ(response.length(), 4);
  grpc::ClientContext context;
  Route(&context, "key-1_A");
  v1::CloseSessionRequest close;
  close.set_session_id(id);
  v1::CloseSessionResponse closed;
  EXPECT_TRUE(stub_->CloseSession(&context, close, &closed).ok());
  EXPECT_GT(closed.freed_bytes(), 0);
}

TEST_F(SessionRoutingTest, KeysAreOneTo64SafeCharacters) {
  v1::SessionInfo info;
  for (const std::string& bad : {std::string(""), std::string(65, 'k'), std::string("a.b"),
                                 std::string("a@b"), std::string("a b")}) {
    const grpc::Status status = Create(bad.c_str(), &info);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "'" << bad << "'";
    EXPECT_THAT(status.error_message(), StartsWith("x-attention-session: expected "));
  }
  ASSERT_TRUE(Create(std::string(64, 'k').c_str(), &info).ok());
  EXPECT_EQ(info.session_id().substr(33), std::string(64, 'k'));
  // Without a key, an id as before: 32 hex digits, and no header needed.
  ASSERT_TRUE(Create(nullptr, &info).ok());
  EXPECT_EQ(info.session_id().size(), 32u);
  EXPECT_TRUE(Get(info.session_id(), nullptr, &info).ok());
}

TEST_F(SessionRoutingTest, AKeyNamesOneLiveSessionAndACreateRetryGetsItBack) {
  v1::SessionInfo first, again;
  ASSERT_TRUE(Create("dup", &first).ok());
  const double live = server_->sessions()->live_sessions();
  // The same key, the same caller and model, nothing appended: a retried
  // CreateSession whose answer was lost gets the same session.
  ASSERT_TRUE(Create("dup", &again).ok());
  EXPECT_EQ(again.session_id(), first.session_id());
  EXPECT_EQ(server_->sessions()->live_sessions(), live);
  // Another model (a cross session) under the key: ALREADY_EXISTS.
  std::mt19937 rng(2);
  {
    grpc::ClientContext context;
    Route(&context, "dup");
    v1::CreateSessionRequest request;
    request.set_model("cross");
    request.set_kind(v1::SESSION_KIND_CROSS);
    ToProto(RandomTensor({5, 12}, rng), request.mutable_key());
    ToProto(RandomTensor({5, 10}, rng), request.mutable_value());
    EXPECT_EQ(stub_->CreateSession(&context, request, &again).error_code(),
              grpc::StatusCode::ALREADY_EXISTS);
  }
  // Once it holds tokens, a new session under its key is refused.
  grpc::Status status;
  v1::AppendResponse response;
  ASSERT_TRUE(Append(first.session_id(), "dup", RandomTensor({2, kE}, rng), 0, &response).ok());
  status = Create("dup", &again);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(status.error_message(),
              HasSubstr("x-attention-session: key 'dup' already names a live session"));
  EXPECT_THAT(status.error_message(), HasSubstr("draw a fresh key"));
  // Closed, the key is free again: a new session, a new id.
  grpc::ClientContext context;
  Route(&context, "dup");
  v1::CloseSessionRequest close;
  close.set_session_id(first.session_id());
  v1::CloseSessionResponse closed;
  ASSERT_TRUE(stub_->CloseSession(&context, close, &closed).ok());
  ASSERT_TRUE(Create("dup", &again).ok());
  EXPECT_NE(again.session_id(), first.session_id());
  EXPECT_EQ(again.session_id().substr(32), ".dup");
}

TEST_F(SessionRoutingTest, ExpectedLengthMismatchFailsAndLeavesTheSessionUnchanged) {
  std::mt19937 rng(3);
  const Tensor x = RandomTensor({9, kE}, rng);
  const Tensor want = Stateless(x);
  v1::SessionInfo info;
  ASSERT_TRUE(Create("len", &info).ok());
  const std::string id = info.session_id();
  v1::AppendResponse response;
  ASSERT_TRUE(Append(id, "len", Rows(x, 0, 3), 0, &response).ok());
  ExpectRows(response.output(), want, 0);
  // The same append again (a retry whose first attempt was applied), and a
  // copy of the session that is behind: both refused, nothing applied.
  for (int64_t expected : {0, 2, 4}) {
    const grpc::Status status = Append(id, "len", Rows(x, 3, 3), expected, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(status.error_message(),
                StartsWith("expected_length: the session holds 3 tokens, the append expected " +
                           std::to_string(expected) + "; it was not applied"));
  }
  const grpc::Status negative = Append(id, "len", Rows(x, 3, 3), -1, &response);
  EXPECT_EQ(negative.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(negative.error_message(), StartsWith("expected_length: "));
  ASSERT_TRUE(Get(id, "len", &info).ok());
  EXPECT_EQ(info.length(), 3);
  ASSERT_TRUE(Append(id, "len", Rows(x, 3, 3), 3, &response).ok());
  ExpectRows(response.output(), want, 3);
  // Absent: not checked.
  ASSERT_TRUE(Append(id, "len", Rows(x, 6, 3), std::nullopt, &response).ok());
  ExpectRows(response.output(), want, 6);
  EXPECT_EQ(response.length(), 9);
}

TEST_F(SessionRoutingTest, StreamsCheckEachAppendWhenItRunsAndAreRoutedByTheirOpeningHeader) {
  std::mt19937 rng(4);
  const Tensor x = RandomTensor({8, kE}, rng);
  const Tensor want = Stateless(x);
  v1::SessionInfo info;
  ASSERT_TRUE(Create("streamed", &info).ok());
  auto send = [&](const char* key, const std::vector<std::pair<int64_t, int64_t>>& appends) {
    grpc::ClientContext context;
    Route(&context, key);
    auto stream = stub_->SessionStream(&context);
    // Pipelined: each append's expected length is checked when it runs,
    // after the ones before it.
    for (size_t i = 0; i < appends.size(); ++i) {
      v1::AppendRequest request;
      request.set_session_id(info.session_id());
      request.set_request_id(std::to_string(i));
      ToProto(Rows(x, appends[i].first, 2), request.mutable_tokens());
      request.set_expected_length(appends[i].second);
      EXPECT_TRUE(stream->Write(request));
    }
    stream->WritesDone();
    std::vector<v1::AppendResponse> responses;
    v1::AppendResponse response;
    while (stream->Read(&response)) responses.push_back(response);
    EXPECT_TRUE(stream->Finish().ok());
    return responses;
  };
  // Rows 0-1, then a duplicate of them (refused), then rows 2-3 and 4-5.
  std::vector<v1::AppendResponse> got = send("streamed", {{0, 0}, {0, 0}, {2, 2}, {4, 4}});
  ASSERT_EQ(got.size(), 4u);
  EXPECT_FALSE(got[0].has_error());
  ExpectRows(got[0].output(), want, 0);
  EXPECT_EQ(got[1].error().code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(got[1].error().message(), StartsWith("expected_length: the session holds 2 tokens"));
  ExpectRows(got[2].output(), want, 2);
  ExpectRows(got[3].output(), want, 4);
  EXPECT_EQ(got[3].length(), 6);
  // A stream opened with another session's key: each append says what to add.
  got = send("other", {{6, 6}});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(got[0].error().message(), HasSubstr("this stream carries 'other'"));
  EXPECT_THAT(got[0].error().message(), HasSubstr("open one stream per session key"));
  // A stream opened without a key (a direct connection, which may carry
  // several sessions) is not checked.
  got = send(nullptr, {{6, 6}});
  ASSERT_EQ(got.size(), 1u);
  ExpectRows(got[0].output(), want, 6);
}

TEST_F(SessionRoutingTest, NotFoundForAnIdWithoutKeySaysToCreateWithTheHeader) {
  v1::SessionInfo info;
  const grpc::Status status = Get(std::string(32, 'a'), nullptr, &info);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("is not known to this server"));
  EXPECT_THAT(status.error_message(),
              HasSubstr("behind a gateway, create sessions with the metadata header "
                        "x-attention-session"));
  // A keyed id not known here (its key moved to this replica): plain NOT_FOUND.
  const grpc::Status moved = Get(std::string(32, 'a') + ".k", "k", &info);
  EXPECT_EQ(moved.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(moved.error_message(), HasSubstr("create a new session and re-send its prefix"));
}

// The inference protocol: the sequence id is the key, and the parameter
// expected_length plays AppendRequest.expected_length's role.
class SequenceRoutingTest : public SessionRoutingTest {
 protected:
  grpc::Status Step(uint64_t id, const Tensor& x, int64_t from, int64_t count, bool start,
                    const inference::InferParameter* expected,
                    inference::ModelInferResponse* response) {
    auto stub = inference::GRPCInferenceService::NewStub(server_->InProcessChannel());
    inference::ModelInferRequest r;
    r.set_model_name("small");
    auto* input = r.add_inputs();
    input->set_name("query");
    input->set_datatype("FP32");
    for (int64_t d : {int64_t{1}, count, kE}) input->add_shape(d);
    const Tensor rows = Rows(x, from, count);
    r.add_raw_input_contents(std::string(static_cast<const char*>(rows.data()), rows.num_bytes()));
    (*r.mutable_parameters())["sequence_id"].set_uint64_param(id);
    if (start) (*r.mutable_parameters())["sequence_start"].set_bool_param(true);
    if (expected != nullptr) (*r.mutable_parameters())["expected_length"] = *expected;
    grpc::ClientContext context;
    context.AddMetadata(kHeader, std::to_string(id));
    return stub->ModelInfer(&context, r, response);
  }
  static inference::InferParameter Int(int64_t v) {
    inference::InferParameter p;
    p.set_int64_param(v);
    return p;
  }
  static void ExpectOutput(const inference::ModelInferResponse& response, const Tensor& want,
                           int64_t from) {
    ASSERT_EQ(response.raw_output_contents_size(), 1);
    const std::string& raw = response.raw_output_contents(0);
    const float* got = reinterpret_cast<const float*>(raw.data());
    for (size_t i = 0; i < raw.size() / 4; ++i) {
      ASSERT_NEAR(got[i], want.as<float>()[from * kE + i], 1e-5) << "value " << i;
    }
  }
};

TEST_F(SequenceRoutingTest, ExpectedLengthParameterRefusesAStaleSequence) {
  std::mt19937 rng(5);
  const Tensor x = RandomTensor({6, kE}, rng);
  const Tensor want = Stateless(x);
  inference::ModelInferResponse response;
  const inference::InferParameter zero = Int(0), two = Int(2), five = Int(5);
  ASSERT_TRUE(Step(77, x, 0, 2, /*start=*/true, &zero, &response).ok());
  ExpectOutput(response, want, 0);
  // A copy that is behind or ahead of what the client sent: refused, unapplied.
  grpc::Status status = Step(77, x, 2, 2, false, &five, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              StartsWith("expected_length: the session holds 2 tokens, the append expected 5"));
  status = Step(77, x, 2, 2, false, &zero, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(Step(77, x, 2, 2, false, &two, &response).ok());
  ExpectOutput(response, want, 2);
  // Wrong type: INVALID_ARGUMENT naming the parameter; absent: not checked.
  inference::InferParameter flag;
  flag.set_bool_param(true);
  status = Step(77, x, 4, 2, false, &flag, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), StartsWith("parameters['expected_length']: expected int64"));
  ASSERT_TRUE(Step(77, x, 4, 2, false, nullptr, &response).ok());
  ExpectOutput(response, want, 4);
  // A restart that expects a non-empty sequence fails and leaves the old one.
  status = Step(77, x, 0, 2, /*start=*/true, &two, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  const inference::InferParameter six = Int(6);
  status = Step(77, x, 0, 1, false, &six, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(SequenceRoutingTest, AnUnknownSequenceSaysWhichHeaderRoutesIt) {
  std::mt19937 rng(6);
  const Tensor x = RandomTensor({1, kE}, rng);
  inference::ModelInferResponse response;
  const grpc::Status status = Step(4242, x, 0, 1, false, nullptr, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("'x-attention-session: 4242'"));
  EXPECT_THAT(status.error_message(), HasSubstr("a restarted sequence takes a new sequence_id"));
}

}  // namespace
}  // namespace attention
