// Model versions while serving (issue 25), where they meet the rest: load
// and unload behind the admin permission on both protocols, sessions of an
// unloaded version, sessions and sequences reporting their version across a
// reload (unary, stream, sequence and REST), and readiness while every
// configured model has a ready version.
#include <grpcpp/grpcpp.h>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_join.h"
#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/fixture/http_test_client.h"
#include "tests/fixture/model_versions_fixture.h"
#include "tests/fixture/token_files.h"

namespace attention {
namespace {

using namespace ::attention::model_versions_test;  // NOLINT: the shared helpers.
using testing::HashHex;

TEST(ModelVersionsTest, LoadAndUnloadNeedTheAdminPermissionOnBothProtocols) {
  const std::string repo = NewModelRepo("admin", 6);
  std::ofstream(repo + "/../tokens_" + std::to_string(getpid()))
      << HashHex("user-secret") << " user *\n"
      << HashHex("admin-secret") << " admin *\n";
  std::ofstream(repo + "/../admins_" + std::to_string(getpid()))
      << HashHex("admin-secret") << " admin m\n";
  auto server = Start(repo, ModelControl::kExplicit, [&](ServerOptions& o) {
    o.auth_tokens_file = repo + "/../tokens_" + std::to_string(getpid());
    o.admin_tokens_file = repo + "/../admins_" + std::to_string(getpid());
    o.http_port = 0;
  });
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  auto oip = inference::GRPCInferenceService::NewStub(server->InProcessChannel());
  auto v1_call = [&](bool load, const std::string& token) {
    grpc::ClientContext context;
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    if (load) {
      v1::LoadModelRequest request;
      request.set_name("m");
      v1::LoadModelResponse response;
      return stub->LoadModel(&context, request, &response);
    }
    v1::UnloadModelRequest request;
    request.set_name("m");
    v1::UnloadModelResponse response;
    return stub->UnloadModel(&context, request, &response);
  };
  auto oip_call = [&](bool load, const std::string& token) {
    grpc::ClientContext context;
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    if (load) {
      inference::RepositoryModelLoadRequest request;
      request.set_model_name("m");
      inference::RepositoryModelLoadResponse response;
      return oip->RepositoryModelLoad(&context, request, &response);
    }
    inference::RepositoryModelUnloadRequest request;
    request.set_model_name("m");
    inference::RepositoryModelUnloadResponse response;
    return oip->RepositoryModelUnload(&context, request, &response);
  };
  auto ready = [&] {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer user-secret");
    inference::RepositoryIndexRequest request;
    inference::RepositoryIndexResponse response;
    EXPECT_TRUE(oip->RepositoryIndex(&context, request, &response).ok());
    return response.models_size() == 1 && response.models(0).state() == "READY";
  };
  // REST: Triton's /v2/repository/models/{m}/load and /unload.
  testing::HttpTestClient rest("127.0.0.1", server->http_port());
  auto post = [&](const std::string& what, const std::string& token) {
    testing::HttpTestHeaders headers;
    if (!token.empty()) headers.emplace_back("Authorization", "Bearer " + token);
    auto res =
        rest.Post(("/v2/repository/models/m/" + what).c_str(), headers, "{}", "application/json");
    return res ? res->status : -1;
  };
  EXPECT_EQ(post("unload", ""), 401);
  EXPECT_EQ(post("unload", "user-secret"), 403);
  EXPECT_EQ(post("unload", "admin-secret"), 200);
  EXPECT_FALSE(ready());
  EXPECT_EQ(post("load", "user-secret"), 403);
  EXPECT_EQ(post("load", "admin-secret"), 200);
  EXPECT_TRUE(ready());
  for (bool oip_protocol : {false, true}) {
    auto call = [&](bool load, const std::string& token) {
      return oip_protocol ? oip_call(load, token) : v1_call(load, token);
    };
    SCOPED_TRACE(oip_protocol ? "inference protocol" : "attention.v1");
    EXPECT_EQ(call(false, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
    const grpc::Status user = call(false, "user-secret");
    EXPECT_EQ(user.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_NE(user.error_message().find("--admin_tokens_file"), std::string::npos);
    EXPECT_TRUE(ready());
    EXPECT_TRUE(call(false, "admin-secret").ok());
    EXPECT_FALSE(ready());
    EXPECT_EQ(call(true, "user-secret").error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_FALSE(ready());
    EXPECT_TRUE(call(true, "admin-secret").ok());
    EXPECT_TRUE(ready());
  }
  server->Drain();
}

TEST(ModelVersionsTest, SessionsOfAnUnloadedVersionEndAndNewOnesUseTheNewVersion) {
  const std::string repo = NewModelRepo("sessions", 7);
  auto server = Start(repo, ModelControl::kPoll);
  auto sessions = v1::SessionService::NewStub(server->InProcessChannel());
  auto create = [&] {
    grpc::ClientContext context;
    v1::SessionInfo info;
    EXPECT_TRUE(testing::CreateSelfSession(*sessions, context, "m", &info).ok());
    return info.session_id();
  };
  auto append = [&](const std::string& id, const Tensor& rows, v1::AppendResponse* response) {
    grpc::ClientContext context;
    v1::AppendRequest request;
    request.set_session_id(id);
    ToProto(rows, request.mutable_tokens());
    return sessions->Append(&context, request, response);
  };
  std::mt19937 rng(4);
  const std::string old_id = create();
  v1::AppendResponse response;
  ASSERT_TRUE(append(old_id, RandomTensor({3, kE}, rng), &response).ok());
  auto v2 = WriteVersion(repo + "/m", 2, 8);
  server->repository()->Poll();
  server->repository()->Poll();
  ASSERT_EQ(server->repository()->Find("m")->version, 2);
  const grpc::Status ended = append(old_id, RandomTensor({1, kE}, rng), &response);
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(ended.error_message().find("model version 1 was unloaded"), std::string::npos)
      << ended.error_message();
  // The replacement session computes on version 2, row for row as a causal
  // pass of the same rows on version 2's engine.
  const std::string id = create();
  const Tensor x = RandomTensor({6, kE}, rng);
  auto engine = *MhaEngine::Create(v2);
  Tensor x3 = Tensor::FromBytes(DType::kFloat32, {1, 6, kE}, x.as<float>());
  MhaInputs in;
  in.query = x3.view();
  in.is_causal = true;
  const MhaOutputs want = *engine->Forward(in);
  int64_t at = 0;
  for (int64_t chunk : {2, 1, 3}) {
    const Tensor rows = Tensor::FromBytes(DType::kFloat32, {chunk, kE}, x.as<float>() + at * kE);
    ASSERT_TRUE(append(id, rows, &response).ok());
    const Tensor out = FromProto(response.output());
    ASSERT_EQ(out.shape(), (Shape{chunk, kE}));
    for (int64_t i = 0; i < chunk * kE; ++i) {
      ASSERT_NEAR(out.as<float>()[i], want.output.as<float>()[at * kE + i], 1e-5) << "row " << at;
    }
    at += chunk;
  }
  server->Drain();
}

// The causal self-attention rows of `x` (T, E) on `model`: what a session's
// appends of x's rows return, in order.
Tensor CausalRows(const std::shared_ptr<const MhaModel>& model, const Tensor& x) {
  auto engine = *MhaEngine::Create(model);
  const int64_t t = x.shape()[0], e = x.shape()[1];
  Tensor x3 = Tensor::FromBytes(DType::kFloat32, {1, t, e}, x.as<float>());
  MhaInputs in;
  in.query = x3.view();
  in.is_causal = true;
  MhaOutputs out = *engine->Forward(in);
  return Tensor::FromBytes(DType::kFloat32, {t, e}, out.output.as<float>());
}

// Rows [from, from + n) of `rows` (T, E) equal `got` (n, E) within 1e-5.
void ExpectRows(const Tensor& rows, int64_t from, const Tensor& got, const std::string& what) {
  const int64_t e = rows.shape()[1];
  ASSERT_EQ(got.shape().back(), e) << what;
  const int64_t n = NumElements(got.shape()) / e;
  for (int64_t i = 0; i < n * e; ++i) {
    ASSERT_NEAR(got.as<float>()[i], rows.as<float>()[from * e + i], 1e-5)
        << what << ", row " << from + i / e;
  }
}

// Every protocol's session answers say which version computed them: a
// session (and an inference-protocol sequence) keeps computing on the
// version it was created on while a newer one serves beside it, new ones
// take the newest, and the old ones end when their version is unloaded.
TEST(ModelVersionsTest, SessionsAndSequencesReportTheirVersionAcrossAReload) {
  const std::string repo = NewRepo("session_versions");
  fs::create_directories(repo + "/m");
  std::ofstream(repo + "/m/config.json") << R"({"version_policy": {"latest": 2}})";
  std::map<int64_t, std::shared_ptr<const MhaModel>> models;
  models[1] = WriteVersion(repo + "/m", 1, 21);
  auto server = Start(repo, ModelControl::kPoll, [](ServerOptions& o) { o.http_port = 0; });
  auto sessions = v1::SessionService::NewStub(server->InProcessChannel());
  auto oip = inference::GRPCInferenceService::NewStub(server->InProcessChannel());
  auto create = [&](v1::SessionInfo* info) {
    grpc::ClientContext context;
    return testing::CreateSelfSession(*sessions, context, "m", info);
  };
  auto append = [&](const std::string& id, const Tensor& rows, v1::AppendResponse* response) {
    grpc::ClientContext context;
    v1::AppendRequest request;
    request.set_session_id(id);
    ToProto(rows, request.mutable_tokens());
    return sessions->Append(&context, request, response);
  };
  // One SessionStream for the whole test: its replies carry the version too.
  grpc::ClientContext stream_context;
  auto stream = sessions->SessionStream(&stream_context);
  auto stream_append = [&](const std::string& id, const Tensor& rows, v1::AppendResponse* r) {
    v1::AppendRequest request;
    request.set_session_id(id);
    ToProto(rows, request.mutable_tokens());
    return stream->Write(request) && stream->Read(r);
  };
  auto sequence_step = [&](bool start, const Tensor& rows, inference::ModelInferResponse* r) {
    inference::ModelInferRequest request = OipRequest(rows);
    testing::AsSequenceStep(request, 42, start);
    grpc::ClientContext context;
    return oip->ModelInfer(&context, request, r);
  };
  auto rows_of = [](const inference::ModelInferResponse& r, int64_t n) {
    return Tensor::FromBytes(DType::kFloat32, {n, kE},
                             reinterpret_cast<const float*>(r.raw_output_contents(0).data()));
  };

  std::mt19937 rng(8);
  const Tensor x = RandomTensor({6, kE}, rng);
  auto chunk = [&](int64_t from, int64_t n) {
    return Tensor::FromBytes(DType::kFloat32, {n, kE}, x.as<float>() + from * kE);
  };
  // Before the reload: a session, a streamed session and a sequence on version 1.
  v1::SessionInfo old_info, streamed_info;
  ASSERT_TRUE(create(&old_info).ok());
  ASSERT_TRUE(create(&streamed_info).ok());
  EXPECT_EQ(old_info.model_version(), 1);
  v1::AppendResponse response;
  ASSERT_TRUE(append(old_info.session_id(), chunk(0, 2), &response).ok());
  EXPECT_EQ(response.model_version(), 1);
  ASSERT_TRUE(stream_append(streamed_info.session_id(), chunk(0, 2), &response));
  ASSERT_FALSE(response.has_error()) << response.error().message();
  EXPECT_EQ(response.model_version(), 1);
  inference::ModelInferResponse step;
  grpc::Status s = sequence_step(/*start=*/true, chunk(0, 2), &step);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(step.model_version(), "1");

  // Version 2 serves beside version 1 (latest: 2) and is the newest.
  models[2] = WriteVersion(repo + "/m", 2, 22);
  server->repository()->Poll();
  server->repository()->Poll();
  ASSERT_EQ(server->repository()->Find("m")->version, 2);
  const Tensor on1 = CausalRows(models[1], x), on2 = CausalRows(models[2], x);
  ASSERT_TRUE(append(old_info.session_id(), chunk(2, 3), &response).ok());
  EXPECT_EQ(response.model_version(), 1);  // Still its own version, row for row.
  ExpectRows(on1, 2, FromProto(response.output()), "old session");
  ASSERT_TRUE(stream_append(streamed_info.session_id(), chunk(2, 1), &response));
  ASSERT_FALSE(response.has_error()) << response.error().message();
  EXPECT_EQ(response.model_version(), 1);
  ExpectRows(on1, 2, FromProto(response.output()), "streamed session");
  s = sequence_step(/*start=*/false, chunk(2, 2), &step);  // The request names no version.
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(step.model_version(), "1");
  ExpectRows(on1, 2, rows_of(step, 2), "sequence");
  v1::SessionInfo new_info;
  ASSERT_TRUE(create(&new_info).ok());
  EXPECT_EQ(new_info.model_version(), 2);
  ASSERT_TRUE(append(new_info.session_id(), chunk(0, 4), &response).ok());
  EXPECT_EQ(response.model_version(), 2);
  ExpectRows(on2, 0, FromProto(response.output()), "new session");
  s = sequence_step(/*start=*/true, chunk(0, 3), &step);  // A restarted sequence: the newest.
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(step.model_version(), "2");
  ExpectRows(on2, 0, rows_of(step, 3), "restarted sequence");
  // REST responses say which version computed them.
  testing::HttpTestClient rest("127.0.0.1", server->http_port());
  const std::string body = R"({"inputs": [{"name": "query", "datatype": "FP32", "shape": [1, 1, )" +
                           std::to_string(kE) + R"(], "data": [)" +
                           absl::StrJoin(std::vector<float>(kE, 0.5f), ",") + "]}]}";
  for (const auto& [path, version] : std::vector<std::pair<std::string, std::string>>{
           {"/v2/models/m/infer", "2"}, {"/v2/models/m/versions/1/infer", "1"}}) {
    auto res = rest.Post(path.c_str(), body, "application/json");
    ASSERT_TRUE(res) << path;
    ASSERT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(nlohmann::json::parse(res->body)["model_version"], version) << path;
  }

  // Version 1 unloaded (the policy now keeps 1): its sessions end, the
  // stream's append is answered with the error, version 2's go on.
  std::ofstream(repo + "/m/config.json") << R"({"version_policy": {"latest": 1}})";
  server->repository()->Poll();
  ASSERT_EQ(server->repository()->Index("m").size(), 1u);
  const grpc::Status ended = append(old_info.session_id(), chunk(5, 1), &response);
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(ended.error_message().find("model version 1 was unloaded"), std::string::npos)
      << ended.error_message();
  ASSERT_TRUE(stream_append(streamed_info.session_id(), chunk(3, 1), &response));
  EXPECT_EQ(response.error().code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(stream_append(new_info.session_id(), chunk(4, 2), &response));
  ASSERT_FALSE(response.has_error()) << response.error().message();
  EXPECT_EQ(response.model_version(), 2);
  ExpectRows(on2, 4, FromProto(response.output()), "new session after the unload");
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  v1::SessionInfo got;
  grpc::ClientContext get_context;
  v1::GetSessionRequest get;
  get.set_session_id(new_info.session_id());
  ASSERT_TRUE(sessions->GetSession(&get_context, get, &got).ok());
  EXPECT_EQ(got.model_version(), 2);
  EXPECT_EQ(got.length(), 6);
  server->Drain();
}

// Readiness (the health service, ServerReady) stays SERVING across swaps,
// refused versions and a model's folder going away, as long as every
// configured model has a serving version; and goes NOT_SERVING when one has
// none.
TEST(ModelVersionsTest, ReadinessStaysServingWhileEveryModelHasAVersion) {
  const std::string repo = NewRepo("readiness");
  for (const char* m : {"a", "b", "c"}) {
    fs::create_directories(repo + "/" + m);
    WriteVersion(repo + "/" + m, 1, 30);
  }
  auto server = Start(repo, ModelControl::kPoll);
  auto oip = inference::GRPCInferenceService::NewStub(server->InProcessChannel());
  auto health = grpc::health::v1::Health::NewStub(server->InProcessChannel());
  std::atomic<bool> stop{false};
  std::atomic<int> checks{0}, not_ready{0};
  std::thread poller([&] {  // ServerReady reads the repository at each call.
    while (!stop.load()) {
      grpc::ClientContext context;
      inference::ServerReadyRequest request;
      inference::ServerReadyResponse response;
      if (!oip->ServerReady(&context, request, &response).ok() || !response.ready()) ++not_ready;
      ++checks;
    }
  });
  absl::Mutex mu;
  std::vector<int> watched;  // Guarded by mu.
  grpc::ClientContext watch_context;
  grpc::health::v1::HealthCheckRequest watch_request;
  auto watch = health->Watch(&watch_context, watch_request);
  std::thread watcher([&] {
    grpc::health::v1::HealthCheckResponse r;
    while (watch->Read(&r)) {
      absl::MutexLock lock(&mu);
      watched.push_back(r.status());
    }
  });
  auto last_watched = [&] {
    absl::MutexLock lock(&mu);
    return watched.empty() ? -1 : watched.back();
  };
  constexpr int kServing = grpc::health::v1::HealthCheckResponse::SERVING;
  constexpr int kNotServing = grpc::health::v1::HealthCheckResponse::NOT_SERVING;
  ASSERT_TRUE(Eventually([&] { return last_watched() == kServing && checks.load() > 0; }));
  const int at_swaps = checks.load();
  for (int64_t v = 2; v <= 4; ++v) {  // Swaps of a, wide enough that loads take a while.
    testing::WriteModelDir(*RandomModel(30 + v, 512), repo + "/a/.tmp");
    fs::rename(repo + "/a/.tmp", repo + "/a/" + std::to_string(v));
    server->repository()->Poll();
    server->repository()->Poll();
    ASSERT_EQ(server->repository()->Find("a")->version, v);
  }
  // ServerReady was asked while the swaps loaded (and published, and unloaded).
  EXPECT_GT(checks.load() - at_swaps, 20);
  WriteVersion(repo + "/b", 2, 40);  // A refused version of b.
  fs::resize_file(repo + "/b/2/model.safetensors", 100);
  server->repository()->Poll();
  server->repository()->Poll();
  ASSERT_EQ(server->repository()->Find("b")->version, 1);
  fs::remove_all(repo + "/c");  // c leaves the repository: no longer configured.
  server->repository()->Poll();
  EXPECT_EQ(server->repository()->Find("c"), nullptr);
  const int before = checks.load();
  ASSERT_TRUE(Eventually([&] { return checks.load() > before + 10; }));
  EXPECT_EQ(not_ready.load(), 0) << "of " << checks.load() << " ServerReady calls";
  {
    absl::MutexLock lock(&mu);
    for (int status : watched) EXPECT_EQ(status, kServing);
  }
  // A configured model left with no version: not ready, until it has one.
  std::ofstream(repo + "/a/config.json") << R"({"version_policy": {"specific": [9]}})";
  server->repository()->Poll();
  EXPECT_EQ(server->repository()->Find("a"), nullptr);
  EXPECT_TRUE(Eventually([&] { return last_watched() == kNotServing; }));
  EXPECT_TRUE(Eventually([&] { return not_ready.load() > 0; }));
  std::ofstream(repo + "/a/config.json") << R"({"version_policy": {"latest": 1}})";
  server->repository()->Poll();
  EXPECT_TRUE(Eventually([&] { return last_watched() == kServing; }));
  stop = true;
  poller.join();
  watch_context.TryCancel();
  watcher.join();
  server->Drain();
}

}  // namespace
}  // namespace attention
