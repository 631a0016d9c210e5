// Who holds a model version, and for how long (server/batching/README.md,
// "Who holds a version"): a stream only while one of its requests is in
// flight; a session call from the moment it finds the session; a
// CreateSession whose version is unloaded under it is refused, never
// crashes; the per-model gauges add up every resident version; a refused
// request's log line names the model it asked for. And where what serves
// changes under long-lived state: every version serving at start has
// session state, a stream's unread response holds no version, and a late
// ForgetModel of a reused address spares the newer version's state.
#include <grpcpp/grpcpp.h>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/requests/call_leases.h"
#include "tests/fixture/http_test_client.h"
#include "tests/fixture/model_versions_fixture.h"

namespace attention {
namespace {

using namespace ::attention::model_versions_test;  // NOLINT: the shared helpers.

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

// A self session of "m"; its id, and its version in `version`.
std::string CreateSession(v1::SessionService::Stub& stub, int64_t* version = nullptr) {
  grpc::ClientContext context;
  v1::SessionInfo info;
  const grpc::Status status = testing::CreateSelfSession(stub, context, "m", &info);
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
  const v1::InferRequest request = InferRequest(query);
  v1::InferResponse response;
  ASSERT_TRUE(infer->Write(request));
  ASSERT_TRUE(infer->Read(&response));
  EXPECT_EQ(response.model_version(), 1);

  auto oip = inference::GRPCInferenceService::NewStub(server->InProcessChannel());
  grpc::ClientContext oip_context;
  auto oip_stream = oip->ModelStreamInfer(&oip_context);
  const inference::ModelInferRequest oip_request = OipRequest(query);
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
  const std::string repo = NewModelRepo("gauges", 41, R"({"version_policy": {"latest": 2}})");
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
        call->reader = attention->AsyncInfer(&call->context, InferRequest(query, v), &cq);
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
  testing::HttpTestClient rest("127.0.0.1", server->http_port());
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

// Every version serving at start has session state, not only the newest:
// under "latest 2", v1 serves sequences asked for by version, and once v2 is
// rolled back (its folder removed, the model reloaded) v1 serves sessions
// again. Before, only the newest version at start got session state: the
// rollback left the model's serving version without it, and every
// CreateSession failed INTERNAL ("has no session state").
TEST(VersionHoldsTest, EveryVersionServingAtStartServesSessions) {
  const std::string repo =
      NewModelRepo("start_versions", 61, R"({"version_policy": {"latest": 2}})");
  WriteVersion(repo + "/m", 2, 62);
  auto server = Start(repo, ModelControl::kExplicit);
  std::mt19937 rng(7);
  const Tensor query = RandomTensor({1, 2, kE}, rng);

  auto oip = inference::GRPCInferenceService::NewStub(server->InProcessChannel());
  {
    grpc::ClientContext context;
    inference::ModelInferResponse response;
    inference::ModelInferRequest start = OipRequest(query, "1");
    testing::AsSequenceStep(start, 7, /*start=*/true, /*end=*/true);
    const grpc::Status status = oip->ModelInfer(&context, start, &response);
    EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
    EXPECT_EQ(response.model_version(), "1");
  }

  fs::remove_all(repo + "/m/2");
  ASSERT_TRUE(server->repository()->LoadModel("m").ok());
  ASSERT_EQ(server->repository()->Find("m")->version, 1);
  auto sessions = v1::SessionService::NewStub(server->InProcessChannel());
  grpc::ClientContext context;
  v1::SessionInfo info;
  const grpc::Status status = testing::CreateSelfSession(*sessions, context, "m", &info);
  EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_EQ(info.model_version(), 1);
  EXPECT_TRUE(
      Eventually([&] { return server->repository()->resident_bytes() == ModelBytes(repo, 1); }));
  server->Drain();
}

// The count of histogram `name`{model="m"} (observations so far).
uint64_t HistogramCount(AttentionServer& server, const std::string& name) {
  for (const auto& family : server.metrics().registry()->Collect()) {
    if (family.name != name) continue;
    for (const auto& metric : family.metric) {
      for (const auto& l : metric.label) {
        if (l.name == "model" && l.value == "m") return metric.histogram.sample_count;
      }
    }
  }
  return 0;
}

// A stream's request holds its version while it is in flight, not while
// its computed response waits for a client that does not read: as for the
// unary calls (async Infer included), a slow reader must not keep an
// unloaded version resident (nor refuse a load under --max_model_bytes).
// Before, the response waiting to be written held the request's leases.
TEST(VersionHoldsTest, AnUnreadStreamResponseHoldsNoVersion) {
  const std::string repo = NewModelRepo("unread_stream", 71);
  auto server = Start(repo, ModelControl::kExplicit);
  std::mt19937 rng(9);
  const Tensor query = RandomTensor({1, 2, kE}, rng);

  auto attention = v1::AttentionService::NewStub(server->InProcessChannel());
  grpc::ClientContext context;
  auto stream = attention->InferStream(&context);
  const v1::InferRequest request = InferRequest(query);
  ASSERT_TRUE(stream->Write(request));
  // Computed; its response is not read yet.
  ASSERT_TRUE(Eventually(
      [&] { return HistogramCount(*server, "attention_compute_duration_seconds") == 1; }));

  WriteVersion(repo + "/m", 2, 72);
  ASSERT_TRUE(server->repository()->LoadModel("m").ok());  // Policy latest 1: v1 unloads.
  EXPECT_TRUE(Eventually([&] {
    return server->repository()->resident_bytes() == ModelBytes(repo, 2);
  })) << server->repository()->resident_bytes()
      << " resident";

  v1::InferResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.model_version(), 1);
  EXPECT_FALSE(response.has_error()) << response.error().message();
  ASSERT_TRUE(stream->Write(request));
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.model_version(), 2);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  server->Drain();
}

// ForgetModel(key) frees the session state of the version freed at that
// address, not that of a newer version the allocator made at the same
// address and unloaded before the older one's ForgetModel came (the reaper
// calls it on its own thread, after freeing the version and trimming the
// heap). Driven on the manager in that order, deterministically: before,
// the newer version's RemoveModel replaced the older state (one entry per
// address) and the late ForgetModel then freed the newer state while a
// call still held its version (CreateSession read a freed SessionModel).
TEST(VersionHoldsTest, ALateForgetModelOfAReusedAddressKeepsTheNewerState) {
  const std::string repo = NewModelRepo("reused_address", 81);
  auto server = Start(repo, ModelControl::kExplicit);
  server::SessionManager* manager = server->sessions();
  server::ModelRef held = server->repository()->Find("m");  // As a call's lease.
  const server::ServedModel* at = held.get();
  manager->RemoveModel(at);  // The older version at this address: unloaded, then freed.
  server::SessionModel* newer = manager->AddModel(at);  // A newer one made there.
  manager->RemoveModel(at);                             // Unloaded while a call holds it.
  manager->ForgetModel(at);                             // The older version's, late.
  EXPECT_EQ(manager->model(at), newer);
  manager->ForgetModel(at);  // The newer version's, once it is freed.
  EXPECT_EQ(manager->model(at), nullptr);
  held.reset();
  server->Drain();
}

}  // namespace
}  // namespace attention
