// A review of issue 33's version holds (server_version_holds_test): where
// what serves changes under long-lived state and a version is left without
// what its calls need, or held longer than the rule in
// server/batching/README.md ("Who holds a version") allows.
#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "tests/fixture/model_versions_fixture.h"

namespace attention {
namespace {

using namespace ::attention::model_versions_test;  // NOLINT: the shared helpers.
namespace fs = std::filesystem;

// A one-step sequence start of (1, 2, E) tokens on version `version` of "m".
inference::ModelInferRequest SequenceStart(const Tensor& query, const std::string& version) {
  inference::ModelInferRequest request;
  request.set_model_name("m");
  request.set_model_version(version);
  auto* input = request.add_inputs();
  input->set_name("query");
  input->set_datatype("FP32");
  for (int64_t d : query.shape()) input->add_shape(d);
  request.add_raw_input_contents(std::string(reinterpret_cast<const char*>(query.as<float>()),
                                             query.num_elements() * sizeof(float)));
  (*request.mutable_parameters())["sequence_id"].set_uint64_param(7);
  (*request.mutable_parameters())["sequence_start"].set_bool_param(true);
  (*request.mutable_parameters())["sequence_end"].set_bool_param(true);
  return request;
}

// Every version serving at start has session state, not only the newest:
// under "latest 2", v1 serves sequences asked for by version, and once v2 is
// rolled back (its folder removed, the model reloaded) v1 serves sessions
// again. Before, only the newest version at start got session state: the
// rollback left the model's serving version without it, and every
// CreateSession failed INTERNAL ("has no session state").
TEST(VersionHoldsReviewTest, EveryVersionServingAtStartServesSessions) {
  const std::string repo = NewRepo("start_versions");
  fs::create_directories(repo + "/m");
  std::ofstream(repo + "/m/config.json") << R"({"version_policy": {"latest": 2}})";
  WriteVersion(repo + "/m", 1, 61);
  WriteVersion(repo + "/m", 2, 62);
  auto server = Start(repo, ModelControl::kExplicit);
  std::mt19937 rng(7);
  const Tensor query = RandomTensor({1, 2, kE}, rng);

  auto oip = inference::GRPCInferenceService::NewStub(server->InProcessChannel());
  {
    grpc::ClientContext context;
    inference::ModelInferResponse response;
    const grpc::Status status = oip->ModelInfer(&context, SequenceStart(query, "1"), &response);
    EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
    EXPECT_EQ(response.model_version(), "1");
  }

  fs::remove_all(repo + "/m/2");
  ASSERT_TRUE(server->repository()->LoadModel("m").ok());
  ASSERT_EQ(server->repository()->Find("m")->version, 1);
  auto sessions = v1::SessionService::NewStub(server->InProcessChannel());
  grpc::ClientContext context;
  v1::CreateSessionRequest request;
  request.set_model("m");
  request.set_kind(v1::SESSION_KIND_SELF);
  v1::SessionInfo info;
  const grpc::Status status = sessions->CreateSession(&context, request, &info);
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
TEST(VersionHoldsReviewTest, AnUnreadStreamResponseHoldsNoVersion) {
  const std::string repo = NewModelRepo("unread_stream", 71);
  auto server = Start(repo, ModelControl::kExplicit);
  std::mt19937 rng(9);
  const Tensor query = RandomTensor({1, 2, kE}, rng);

  auto attention = v1::AttentionService::NewStub(server->InProcessChannel());
  grpc::ClientContext context;
  auto stream = attention->InferStream(&context);
  v1::InferRequest request;
  request.set_model("m");
  ToProto(query, request.mutable_query());
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
TEST(VersionHoldsReviewTest, ALateForgetModelOfAReusedAddressKeepsTheNewerState) {
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
