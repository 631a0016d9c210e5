// Who holds a model version, and for how long (server/batching/README.md,
// "Who holds a version"): a stream only while one of its requests is in
// flight; a session call from the moment it finds the session; a
// CreateSession whose version is unloaded under it is refused, never
// crashes; the per-model gauges add up every resident version; a refused
// request's log line names the model it asked for.
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/requests/call_leases.h"
#include "tests/fixture/model_versions_fixture.h"

namespace attention {
namespace {

using namespace ::attention::model_versions_test;  // NOLINT: the shared helpers.
namespace fs = std::filesystem;

// The value of gauge `name`{model="m"}.
double Gauge(AttentionServer& server, const std::string& name) {
  for (const auto& family : server.metrics().registry()->Collect()) {
    if (family.name != name) continue;
    for (const auto& metric : family.metric) {
      for (const auto& l : metric.label) {
        if (l.name == "model" && l.value == "m") return metric.gauge.value;
      }
    }
  }
  return -1;
}

std::string CreateSession(v1::SessionService::Stub& stub, int64_t* version = nullptr) {
  grpc::ClientContext context;
  v1::CreateSessionRequest request;
  request.set_model("m");
  request.set_kind(v1::SESSION_KIND_SELF);
  v1::SessionInfo info;
  const grpc::Status status = stub.CreateSession(&context, request, &info);
  EXPECT_TRUE(status.ok()) << status.error_message();
  if (version != nullptr) *version = info.model_version();
  return info.session_id();
}

// A stream that has had its answer and sits idle holds no version: once v1
// is unloaded for v2, v1 is freed while both streams stay open, and their
// next requests compute on v2.
TEST(VersionHoldsTest, IdleStreamsHoldNoVersion) {
  const std::string repo = NewModelRepo("idle_streams", 11);
  auto server = Start(repo, ModelControl::kExplicit);
  std::mt19937 rng(3);
  const Tensor query = RandomTensor({1, 2, kE}, rng);

  auto attention = v1::AttentionService::NewStub(server->InProcessChannel());
  grpc::ClientContext infer_context;
  auto infer = attention->InferStream(&infer_context);
  v1::InferRequest request;
  request.set_model("m");
  ToProto(query, request.mutable_query());
  v1::InferResponse response;
  ASSERT_TRUE(infer->Write(request));
  ASSERT_TRUE(infer->Read(&response));
  EXPECT_EQ(response.model_version(), 1);

  auto oip = inference::GRPCInferenceService::NewStub(server->InProcessChannel());
  grpc::ClientContext oip_context;
  auto oip_stream = oip->ModelStreamInfer(&oip_context);
  inference::ModelInferRequest oip_request;
  oip_request.set_model_name("m");
  auto* input = oip_request.add_inputs();
  input->set_name("query");
  input->set_datatype("FP32");
  for (int64_t d : query.shape()) input->add_shape(d);
  oip_request.add_raw_input_contents(std::string(reinterpret_cast<const char*>(query.as<float>()),
                                                 query.num_elements() * sizeof(float)));
  inference::ModelStreamInferResponse oip_response;
  ASSERT_TRUE(oip_stream->Write(oip_request));
  ASSERT_TRUE(oip_stream->Read(&oip_response));
  EXPECT_EQ(oip_response.error_message(), "");
  EXPECT_EQ(oip_response.infer_response().model_version(), "1");

  WriteVersion(repo + "/m", 2, 12);
  ASSERT_TRUE(server->repository()->LoadModel("m").ok());  // Policy latest 1: v1 unloads.
  ASSERT_EQ(server->repository()->Find("m")->version, 2);
  const int64_t v2_bytes = ModelBytes(repo, 2);
  EXPECT_TRUE(Eventually([&] { return server->repository()->resident_bytes() == v2_bytes; }))
      << server->repository()->resident_bytes() << " resident, " << v2_bytes << " expected";

  ASSERT_TRUE(infer->Write(request));
  ASSERT_TRUE(infer->Read(&response));
  EXPECT_EQ(response.model_version(), 2);
  ASSERT_TRUE(oip_stream->Write(oip_request));
  ASSERT_TRUE(oip_stream->Read(&oip_response));
  EXPECT_EQ(oip_response.infer_response().model_version(), "2");
  infer->WritesDone();
  EXPECT_TRUE(infer->Finish().ok());
  oip_stream->WritesDone();
  EXPECT_TRUE(oip_stream->Finish().ok());
  server->Drain();
}

// The crash of CreateSession racing an unload, made deterministic: a call
// that found version 1 (and holds it) still finds its session state after
// the unload, and Create refuses it with NOT_FOUND instead of creating a
// session nothing would ever end.
TEST(VersionHoldsTest, CreateOnAVersionUnloadedAfterItsLookupIsNotFound) {
  const std::string repo = NewModelRepo("create_unloaded", 21);
  auto server = Start(repo, ModelControl::kExplicit);
  server::ModelRef v1 = server->repository()->Find("m");  // As a call's lease.
  ASSERT_NE(v1, nullptr);
  ASSERT_TRUE(server->repository()->UnloadModel("m").ok());
  server::SessionManager* manager = server->sessions();
  ASSERT_NE(manager->model(v1.get()), nullptr) << "a held version keeps its session state";
  auto created =
      manager->Create(v1.get(), /*cross=*/false, /*is_causal=*/false, absl::ZeroDuration());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kNotFound) << created.status();
  EXPECT_NE(created.status().message().find("was unloaded"), absl::string_view::npos)
      << created.status();
  EXPECT_EQ(manager->live_sessions(), 0);
  v1.reset();
  EXPECT_TRUE(Eventually([&] { return server->repository()->resident_bytes() == 0; }));
  server->Drain();
}

// A session found by a call holds its version until the call lets go: the
// version stays resident (its engine readable) after the unload, and is
// freed once the leases go.
TEST(VersionHoldsTest, AFoundSessionHoldsItsVersionUntilTheCallEnds) {
  const std::string repo = NewModelRepo("found_session", 31);
  auto server = Start(repo, ModelControl::kExplicit);
  auto sessions = v1::SessionService::NewStub(server->InProcessChannel());
  const std::string id = CreateSession(*sessions);
  auto leases = std::make_shared<server::CallLeases>();
  auto found = server->sessions()->Find(id, leases.get());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(leases->held(), 1u);
  WriteVersion(repo + "/m", 2, 32);
  ASSERT_TRUE(server->repository()->LoadModel("m").ok());
  const int64_t both = ModelBytes(repo, 1) + ModelBytes(repo, 2);
  EXPECT_EQ(server->repository()->resident_bytes(), both);
  // What a call reads of its session's model is still there.
  EXPECT_EQ((*found)->model->served->version, 1);
  EXPECT_TRUE((*found)->model->engine->SupportsSelf().ok());
  EXPECT_EQ(server->sessions()->Find(id).status().code(), absl::StatusCode::kNotFound);
  leases.reset();
  EXPECT_TRUE(
      Eventually([&] { return server->repository()->resident_bytes() == ModelBytes(repo, 2); }));
  server->Drain();
}

// attention_sessions{model} counts the sessions of every version (3 on v1,
// 1 on v2 under "latest 2" read 1 before: each version set its own count),
// and attention_queue_depth{model} the requests queued on every version.
TEST(VersionHoldsTest, PerModelGaugesAddUpEveryVersion) {
  const std::string repo = NewRepo("gauges");
  fs::create_directories(repo + "/m");
  std::ofstream(repo + "/m/config.json") << R"({"version_policy": {"latest": 2}})";
  WriteVersion(repo + "/m", 1, 41);
  auto server = Start(repo, ModelControl::kExplicit,
                      [](ServerOptions& o) { o.repository.batching.max_batch_size = 1; });
  auto sessions = v1::SessionService::NewStub(server->InProcessChannel());
  int64_t version = 0;
  for (int i = 0; i < 3; ++i) {
    CreateSession(*sessions, &version);
    EXPECT_EQ(version, 1);
  }
  WriteVersion(repo + "/m", 2, 42);
  ASSERT_TRUE(server->repository()->LoadModel("m").ok());
  CreateSession(*sessions, &version);
  EXPECT_EQ(version, 2);
  EXPECT_EQ(Gauge(*server, "attention_sessions"), 4);

  // Batches wait on the compute lock: each version computes one request
  // and queues the rest.
  auto attention = v1::AttentionService::NewStub(server->InProcessChannel());
  std::mt19937 rng(5);
  const Tensor query = RandomTensor({1, 2, kE}, rng);
  struct Call {
    grpc::ClientContext context;
    v1::InferResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::InferResponse>> reader;
  };
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<Call>> calls;
  {
    absl::MutexLock hold(server->repository()->compute_mutex());
    for (int64_t v : {1, 2}) {
      for (int i = 0; i < 3; ++i) {
        auto call = std::make_unique<Call>();
        v1::InferRequest request;
        request.set_model("m");
        request.set_model_version(v);
        ToProto(query, request.mutable_query());
        call->reader = attention->AsyncInfer(&call->context, request, &cq);
        call->reader->Finish(&call->response, &call->status, call.get());
        calls.push_back(std::move(call));
      }
    }
    EXPECT_TRUE(Eventually([&] { return Gauge(*server, "attention_queue_depth") == 4; }))
        << Gauge(*server, "attention_queue_depth");
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    void* tag = nullptr;
    bool ok = false;
    ASSERT_TRUE(cq.Next(&tag, &ok));
    EXPECT_TRUE(static_cast<Call*>(tag)->status.ok());
  }
  EXPECT_EQ(Gauge(*server, "attention_queue_depth"), 0);
  server->Drain();
  cq.Shutdown();
}

// A REST request to a model that is not served is logged with the model
// it named (it read "model=-").
TEST(VersionHoldsTest, RestLogNamesTheModelAskedFor) {
  const std::string repo = NewModelRepo("rest_log", 51);
  auto server = Start(repo, ModelControl::kExplicit, [](ServerOptions& o) { o.http_port = 0; });
  httplib::Client rest("127.0.0.1", server->http_port());
  ::testing::internal::CaptureStderr();
  const nlohmann::json body = {{"inputs",
                                {{{"name", "query"},
                                  {"datatype", "FP32"},
                                  {"shape", {1, 1, kE}},
                                  {"data", std::vector<float>(kE, 0.0f)}}}}};
  auto refused = rest.Post("/v2/models/nosuch/infer", body.dump(), "application/json");
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 404) << refused->body;
  EXPECT_NE(log.find("model=nosuch"), std::string::npos) << log;
  server->Drain();
}

}  // namespace
}  // namespace attention
