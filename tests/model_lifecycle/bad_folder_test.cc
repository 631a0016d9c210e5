// One bad model folder at start (issue 38, wall 5): a config.json typo in
// one folder of --model_repository no longer stops the server. The good
// models serve; the bad one is reported where an operator looks: the
// repository index (the Open Inference Protocol's RepositoryIndex and
// REST's), its model readiness (NOT_FOUND with the reason), the start-up
// log; server readiness waits only for what loaded. With exit_on_error
// (--exit_on_error; tests/process/start_up_test checks the binary) the
// start-up fails naming the folder.
#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/http_test_client.h"
#include "tests/fixture/model_versions_fixture.h"

namespace attention {
namespace {

using namespace ::attention::model_versions_test;  // NOLINT: the shared helpers.
using ::testing::HasSubstr;
using ::testing::Not;

// A repository of "good" (a flat model) and "bad" (its config.json has the
// typo "embeddim" beside its real keys).
std::string GoodAndBadRepo(const std::string& name) {
  const std::string repo = NewRepo(name);
  testing::WriteModelDir(*RandomModel(1), repo + "/good");
  testing::WriteModelDir(*RandomModel(2), repo + "/bad", "\"embeddim\": 32");
  return repo;
}

TEST(BadModelFolderTest, TheGoodModelsServeAndTheIndexSaysWhyTheBadOneDoesNot) {
  auto server = Start(GoodAndBadRepo("serve"), ModelControl::kNone,
                      [](ServerOptions& o) { o.http_port = 0; });
  ASSERT_NE(server, nullptr);
  ASSERT_NE(server->repository(), nullptr) << "the bad folder stopped the start-up";
  auto channel = server->InProcessChannel();
  // The good model computes.
  auto stub = v1::AttentionService::NewStub(channel);
  std::mt19937 rng(3);
  v1::InferRequest request;
  request.set_model("good");
  testing::ToProto(RandomTensor({1, 3, kE}, rng), request.mutable_query());
  v1::InferResponse response;
  grpc::ClientContext infer_context;
  EXPECT_TRUE(stub->Infer(&infer_context, request, &response).ok());
  // Server readiness: what loaded serves.
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest check;
  grpc::health::v1::HealthCheckResponse checked;
  grpc::ClientContext health_context;
  ASSERT_TRUE(health->Check(&health_context, check, &checked).ok());
  EXPECT_EQ(checked.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  // The Open Inference Protocol's index: the bad one UNAVAILABLE, with why.
  auto oip = inference::GRPCInferenceService::NewStub(channel);
  inference::RepositoryIndexRequest index_request;
  inference::RepositoryIndexResponse index;
  grpc::ClientContext index_context;
  ASSERT_TRUE(oip->RepositoryIndex(&index_context, index_request, &index).ok());
  bool good_ready = false, bad_reported = false;
  for (const auto& m : index.models()) {
    if (m.name() == "good") good_ready = m.state() == "READY";
    if (m.name() == "bad") {
      bad_reported = m.state() == "UNAVAILABLE";
      EXPECT_THAT(m.reason(), HasSubstr("unknown key 'embeddim'"));
    }
  }
  EXPECT_TRUE(good_ready);
  EXPECT_TRUE(bad_reported) << index.DebugString();
  // Its readiness says why.
  inference::ModelReadyRequest ready_request;
  ready_request.set_name("bad");
  inference::ModelReadyResponse ready;
  grpc::ClientContext ready_context;
  const grpc::Status not_ready = oip->ModelReady(&ready_context, ready_request, &ready);
  EXPECT_EQ(not_ready.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(not_ready.error_message(), HasSubstr("unknown key 'embeddim'"));
  EXPECT_FALSE(ready.ready());
  // REST's index says the same.
  testing::HttpTestClient http("127.0.0.1", server->http_port());
  const auto rest = http.Post("/v2/repository/index", "{}", "application/json");
  ASSERT_EQ(rest->status, 200) << rest->body;
  bool rest_reported = false;
  for (const auto& m : nlohmann::json::parse(rest->body)) {
    if (m.value("name", "") == "bad") {
      rest_reported = m.value("state", "") == "UNAVAILABLE" &&
                      m.value("reason", "").find("embeddim") != std::string::npos;
    }
  }
  EXPECT_TRUE(rest_reported) << rest->body;
  server->Drain();
}

// The index's line for model `name` ("" when it has none).
std::string IndexLine(AttentionServer& server, const std::string& name) {
  auto oip = inference::GRPCInferenceService::NewStub(server.InProcessChannel());
  inference::RepositoryIndexRequest request;
  inference::RepositoryIndexResponse index;
  grpc::ClientContext context;
  if (!oip->RepositoryIndex(&context, request, &index).ok()) return "(no index)";
  std::string line;
  for (const auto& m : index.models()) {
    if (m.name() == name) absl::StrAppend(&line, m.version(), " ", m.state(), " ", m.reason());
  }
  return line;
}

// Poll mode: the bad folder fixed is loaded and its reason goes; a bad
// folder (or version) removed no longer says what was wrong with its
// files.
TEST(BadModelFolderTest, PollModeFixedFolderLoadsAndARemovedOneLosesItsReason) {
  const std::string repo = GoodAndBadRepo("poll");
  testing::WriteModelDir(*RandomModel(3), repo + "/gone", "\"embeddim\": 32");
  // "v": version 1 serves, version 2 has the typo (then is deleted).
  WriteVersion(repo + "/v", 1, 4);
  WriteVersion(repo + "/v", 2, 5, "\"embeddim\": 32");
  auto server = Start(repo, ModelControl::kPoll);
  ASSERT_NE(server, nullptr);
  ASSERT_NE(server->repository(), nullptr);
  EXPECT_THAT(IndexLine(*server, "bad"), HasSubstr("embeddim"));
  EXPECT_THAT(IndexLine(*server, "gone"), HasSubstr("embeddim"));
  EXPECT_THAT(IndexLine(*server, "v"), HasSubstr("embeddim"));
  // Fixed: a poll sees it changed, the next loads it.
  testing::WriteModelDir(*RandomModel(2), repo + "/bad");
  std::filesystem::remove_all(repo + "/gone");
  std::filesystem::remove_all(repo + "/v/2");
  for (int i = 0; i < 3 && server->repository()->Find("bad") == nullptr; ++i) {
    server->repository()->Poll();
  }
  EXPECT_NE(server->repository()->Find("bad"), nullptr) << IndexLine(*server, "bad");
  EXPECT_THAT(IndexLine(*server, "bad"), Not(HasSubstr("embeddim")));
  // Removed: nothing of its old files' fault is said any more.
  EXPECT_THAT(IndexLine(*server, "gone"), Not(HasSubstr("embeddim")));
  EXPECT_EQ(IndexLine(*server, "v"), "1 READY ");
  server->Drain();
}

// The default model (no --default_model) is the first folder by name, as
// documented, whether or not it loaded: a bad "a" does not hand requests
// naming no model to "b" (computing with other weights than the caller
// would get after the next restart, or once "a" is fixed). They are
// refused naming the default and why it does not serve.
TEST(BadModelFolderTest, TheDefaultModelDoesNotMoveToAnotherWhenTheFirstIsBad) {
  const std::string repo = NewRepo("default");
  testing::WriteModelDir(*RandomModel(1), repo + "/a", "\"embeddim\": 32");
  testing::WriteModelDir(*RandomModel(2), repo + "/b");
  auto server = Start(repo, ModelControl::kPoll);
  ASSERT_NE(server, nullptr);
  ASSERT_NE(server->repository(), nullptr);
  EXPECT_EQ(server->repository()->default_model(), "a");
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  std::mt19937 rng(3);
  v1::InferRequest request;  // No model named.
  testing::ToProto(RandomTensor({1, 3, kE}, rng), request.mutable_query());
  v1::InferResponse response;
  grpc::ClientContext context;
  const grpc::Status status = stub->Infer(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << "computed by another model";
  EXPECT_THAT(status.error_message(), HasSubstr("'a'"));
  EXPECT_THAT(status.error_message(), HasSubstr("embeddim"));
  // Fixed: requests naming no model go to it.
  testing::WriteModelDir(*RandomModel(1), repo + "/a");
  for (int i = 0; i < 3 && server->repository()->Find("a") == nullptr; ++i) {
    server->repository()->Poll();
  }
  v1::GetModelRequest get;  // No name: the default.
  v1::ModelInfo info;
  grpc::ClientContext get_context;
  ASSERT_TRUE(stub->GetModel(&get_context, get, &info).ok());
  EXPECT_EQ(info.name(), "a");
  server->Drain();
}

TEST(BadModelFolderTest, ExitOnErrorFailsTheStartUpNamingTheFolder) {
  const std::string repo = GoodAndBadRepo("exit");
  ServerOptions options = testing::TestServerOptions(repo);
  options.repository.exit_on_error = true;
  auto server = AttentionServer::Listen(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const absl::Status loaded = (*server)->LoadModels();
  EXPECT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.message()), HasSubstr(repo + "/bad"));
  EXPECT_THAT(std::string(loaded.message()), HasSubstr("embeddim"));
  (*server)->Drain();
}

}  // namespace
}  // namespace attention
