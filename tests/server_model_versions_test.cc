// Model versions while serving (issue 25): layout and policy, requests naming
// a version and responses saying which computed them, replacing a model under
// continuous load with no request lost, refused versions, unload draining,
// explicit control behind the admin permission, sessions across a reload and
// memory across repeated swaps.
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server/attention_server.h"
#include "server/security/token_authenticator.h"
#include "tests/server_test_util.h"
#include "tests/test_util.h"

namespace attention {
namespace {

namespace fs = std::filesystem;
using server::AttentionServer;
using server::ModelControl;
using server::ServerOptions;
using testing::FromProto;
using testing::RandomTensor;
using testing::ToProto;

constexpr int64_t kE = 32;

std::shared_ptr<const MhaModel> RandomModel(uint64_t seed, int64_t e = kE) {
  return *MhaModel::Random(testing::SelfAttentionSpec(e, 4), seed);
}

// Writes version `v` of the model in `model_dir` under a hidden name, then
// renames it into place (the documented convention).
std::shared_ptr<const MhaModel> WriteVersion(const std::string& model_dir, int64_t v, uint64_t seed,
                                             const std::string& extra = "") {
  auto model = RandomModel(seed);
  const std::string tmp = model_dir + "/..tmp_" + std::to_string(v);
  testing::WriteModelDir(*model, tmp, extra);
  fs::rename(tmp, model_dir + "/" + std::to_string(v));
  return model;
}

std::string NewRepo(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/versions_" + name + "_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::unique_ptr<AttentionServer> Start(const std::string& repo, ModelControl control,
                                       const std::function<void(ServerOptions&)>& tweak = {}) {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;
  options.drain_grace = absl::ZeroDuration();
  options.repository.path = repo;
  options.repository.control = control;
  options.repository.poll_interval = absl::Hours(1);  // The tests call Poll().
  options.repository.compute_threads = 1;
  if (tweak) tweak(options);
  auto server = AttentionServer::Listen(options);
  EXPECT_TRUE(server.ok()) << server.status();
  const absl::Status loaded = (*server)->LoadModels();
  EXPECT_TRUE(loaded.ok()) << loaded;
  return *std::move(server);
}

// Waits (bounded) until `done` holds; false if it never did.
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 2000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

// Largest |a - b| between a response's output and the engine's solo result.
double Error(const MhaModel& model, const Tensor& query, const Tensor& output) {
  static absl::Mutex mu;
  static auto* engines = new std::map<const MhaModel*, std::unique_ptr<MhaEngine>>();
  const MhaEngine* engine = nullptr;
  {
    absl::MutexLock lock(&mu);
    auto& slot = (*engines)[&model];
    if (slot == nullptr) {
      slot = *MhaEngine::Create(std::shared_ptr<const MhaModel>(&model, [](const MhaModel*) {}));
    }
    engine = slot.get();
  }
  MhaInputs in;
  in.query = query.view();
  MhaOutputs want = *engine->Forward(in);
  double worst = 0;
  const int64_t n = NumElements(output.shape());
  if (n != NumElements(want.output.shape())) return 1e9;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max(
        worst, static_cast<double>(std::abs(output.as<float>()[i] - want.output.as<float>()[i])));
  }
  return worst;
}

grpc::Status Infer(v1::AttentionService::Stub& stub, const Tensor& query, int64_t version,
                   v1::InferResponse* response, const std::string& model = "m") {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::InferRequest request;
  request.set_model(model);
  request.set_model_version(version);
  ToProto(query, request.mutable_query());
  return stub.Infer(&context, request, response);
}

double LoadCount(AttentionServer& server, const std::string& model, const std::string& version,
                 const std::string& result) {
  for (const auto& family : server.metrics().registry()->Collect()) {
    if (family.name != "attention_model_loads_total") continue;
    for (const auto& metric : family.metric) {
      std::map<std::string, std::string> labels;
      for (const auto& l : metric.label) labels[l.name] = l.value;
      if (labels["model"] == model && labels["version"] == version && labels["result"] == result) {
        return metric.counter.value;
      }
    }
  }
  return 0;
}

TEST(ModelVersionsTest, PolicyPicksVersionsAndRequestsNameThem) {
  const std::string repo = NewRepo("policy");
  fs::create_directories(repo + "/m");
  std::ofstream(repo + "/m/config.json") << R"({"version_policy": {"latest": 2}})";
  std::map<int64_t, std::shared_ptr<const MhaModel>> models;
  for (int64_t v : {1, 2, 3}) models[v] = WriteVersion(repo + "/m", v, 10 + v);
  testing::WriteModelDir(*RandomModel(99), repo + "/flat");
  auto server = Start(repo, ModelControl::kNone);
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  std::mt19937 rng(1);
  const Tensor q = RandomTensor({1, 5, kE}, rng);
  v1::InferResponse response;
  ASSERT_TRUE(Infer(*stub, q, 0, &response).ok());
  EXPECT_EQ(response.model_version(), 3);
  EXPECT_LT(Error(*models[3], q, FromProto(response.output())), 1e-5);
  ASSERT_TRUE(Infer(*stub, q, 2, &response).ok());
  EXPECT_EQ(response.model_version(), 2);
  EXPECT_LT(Error(*models[2], q, FromProto(response.output())), 1e-5);
  EXPECT_GT(Error(*models[3], q, FromProto(response.output())), 1e-3);  // Really another version.
  const grpc::Status old = Infer(*stub, q, 1, &response);
  EXPECT_EQ(old.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(old.error_message().find("serving: 2, 3"), std::string::npos) << old.error_message();
  ASSERT_TRUE(Infer(*stub, q, 0, &response, "flat").ok());
  EXPECT_EQ(response.model_version(), 1);  // The flat layout is version 1.

  v1::GetModelRequest get;
  get.set_name("m");
  v1::ModelInfo info;
  grpc::ClientContext get_context;
  ASSERT_TRUE(stub->GetModel(&get_context, get, &info).ok());
  EXPECT_EQ(info.version(), 3);
  ASSERT_EQ(info.versions_size(), 2);
  EXPECT_EQ(info.versions(0).version(), 2);
  EXPECT_EQ(info.versions(1).state(), "READY");

  // The Open Inference Protocol resolves the same versions.
  auto oip = inference::GRPCInferenceService::NewStub(server->InProcessChannel());
  inference::ModelInferRequest request;
  request.set_model_name("m");
  request.set_model_version("2");
  auto* input = request.add_inputs();
  input->set_name("query");
  input->set_datatype("FP32");
  for (int64_t d : q.shape()) input->add_shape(d);
  request.add_raw_input_contents(std::string(static_cast<const char*>(q.data()), q.num_bytes()));
  inference::ModelInferResponse oip_response;
  grpc::ClientContext infer_context;
  const grpc::Status infer = oip->ModelInfer(&infer_context, request, &oip_response);
  ASSERT_TRUE(infer.ok()) << infer.error_message();
  EXPECT_EQ(oip_response.model_version(), "2");
  request.set_model_version("x");
  grpc::ClientContext bad_context;
  EXPECT_EQ(oip->ModelInfer(&bad_context, request, &oip_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  inference::ModelMetadataRequest meta;
  meta.set_name("m");
  inference::ModelMetadataResponse meta_response;
  grpc::ClientContext meta_context;
  ASSERT_TRUE(oip->ModelMetadata(&meta_context, meta, &meta_response).ok());
  EXPECT_EQ(
      std::vector<std::string>(meta_response.versions().begin(), meta_response.versions().end()),
      (std::vector<std::string>{"2", "3"}));
  server->Drain();
}

TEST(ModelVersionsTest, ReplacingUnderContinuousLoadLosesNoRequest) {
  const std::string repo = NewRepo("replace");
  fs::create_directories(repo + "/m");
  constexpr int kSwaps = 6;
  std::map<int64_t, std::shared_ptr<const MhaModel>> models;
  models[1] = WriteVersion(repo + "/m", 1, 100);
  for (int64_t v = 2; v <= 1 + kSwaps; ++v) models[v] = RandomModel(100 + v);
  auto server = Start(repo, ModelControl::kPoll, [](ServerOptions& o) {
    o.repository.batching.max_queue_delay_us = 500;  // Batches of several clients.
  });
  std::atomic<bool> stop{false};
  std::atomic<int> failed{0}, wrong{0};
  absl::Mutex mu;
  std::map<int64_t, int> by_version;  // Guarded by mu.
  auto check = [&](const Tensor& q, int64_t version, const v1::InferResponse& r) {
    auto it = models.find(version);
    if (it == models.end() || Error(*it->second, q, FromProto(r.output())) > 1e-5) ++wrong;
    absl::MutexLock lock(&mu);
    ++by_version[version];
  };
  std::vector<std::thread> clients;
  for (int c = 0; c < 3; ++c) {  // Unary clients.
    clients.emplace_back([&, c] {
      auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
      std::mt19937 rng(c);
      while (!stop.load()) {
        const Tensor q = RandomTensor({1, 1 + static_cast<int64_t>(rng() % 9), kE}, rng);
        v1::InferResponse r;
        const grpc::Status s = Infer(*stub, q, 0, &r);
        if (!s.ok()) {
          ++failed;
          ADD_FAILURE() << s.error_message();
          continue;
        }
        check(q, r.model_version(), r);
      }
    });
  }
  clients.emplace_back([&] {  // A stream, request by request.
    auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
    grpc::ClientContext context;
    auto stream = stub->InferStream(&context);
    std::mt19937 rng(77);
    while (!stop.load()) {
      const Tensor q = RandomTensor({2, 4, kE}, rng);
      v1::InferRequest request;
      request.set_model("m");
      ToProto(q, request.mutable_query());
      v1::InferResponse r;
      if (!stream->Write(request) || !stream->Read(&r) || r.has_error()) {
        ++failed;
        ADD_FAILURE() << r.error().message();
        return;
      }
      check(q, r.model_version(), r);
    }
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  });
  auto served = [&](int64_t v) {
    absl::MutexLock lock(&mu);
    return by_version[v];
  };
  for (int64_t v = 2; v <= 1 + kSwaps; ++v) {
    ASSERT_TRUE(Eventually([&] { return served(v - 1) >= 5; }));  // Traffic on the old one.
    testing::WriteModelDir(*models[v], repo + "/m/..tmp");
    fs::rename(repo + "/m/..tmp", repo + "/m/" + std::to_string(v));
    server->repository()->Poll();  // Seen once: not loaded yet.
    EXPECT_EQ(server->repository()->Find("m")->version, v - 1);
    server->repository()->Poll();  // Unchanged across two polls: loaded, the old unloaded.
    EXPECT_EQ(server->repository()->Find("m")->version, v);
    EXPECT_EQ(LoadCount(*server, "m", std::to_string(v), "success"), 1);
  }
  ASSERT_TRUE(Eventually([&] { return served(1 + kSwaps) >= 5; }));
  stop = true;
  for (auto& t : clients) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  for (int64_t v = 1; v <= 1 + kSwaps; ++v) EXPECT_GE(served(v), 5) << "version " << v;
  // Every old version is freed once its last request ended: one resident.
  const int64_t one = static_cast<int64_t>(fs::file_size(repo + "/m/1/model.safetensors"));
  EXPECT_TRUE(Eventually([&] { return server->repository()->resident_bytes() == one; }));

  // In poll mode the folders decide: explicit loads are refused.
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  v1::LoadModelRequest load;
  load.set_name("m");
  v1::LoadModelResponse loaded;
  grpc::ClientContext context;
  const grpc::Status refused = stub->LoadModel(&context, load, &loaded);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("--model_control=poll"), std::string::npos);
  server->Drain();
}

TEST(ModelVersionsTest, BrokenVersionsAreRefusedAndTheOldServes) {
  const std::string repo = NewRepo("broken");
  fs::create_directories(repo + "/m");
  auto v1_model = WriteVersion(repo + "/m", 1, 1);
  auto server = Start(repo, ModelControl::kPoll);
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  std::mt19937 rng(2);
  const Tensor q = RandomTensor({1, 3, kE}, rng);
  // A truncated file (a copy that stopped): refused once it stays so.
  WriteVersion(repo + "/m", 2, 2);
  const std::string weights = repo + "/m/2/model.safetensors";
  fs::resize_file(weights, fs::file_size(weights) / 2);
  server->repository()->Poll();
  server->repository()->Poll();
  server->repository()->Poll();
  EXPECT_EQ(LoadCount(*server, "m", "2", "failure"), 1);  // Refused once, not retried.
  // A complete file whose shapes disagree with its config.
  WriteVersion(repo + "/m", 3, 3);
  std::ofstream(repo + "/m/3/config.json") << R"({"embed_dim": 48, "num_heads": 4})";
  server->repository()->Poll();
  server->repository()->Poll();
  EXPECT_EQ(LoadCount(*server, "m", "3", "failure"), 1);
  bool two = false, three = false;
  for (const auto& v : server->repository()->Index("m")) {
    if (v.version == 2) {
      two = v.state == "UNAVAILABLE" && v.reason.find("bytes") != std::string::npos;
    }
    if (v.version == 3) three = v.state == "UNAVAILABLE" && !v.reason.empty();
  }
  EXPECT_TRUE(two);
  EXPECT_TRUE(three);
  v1::InferResponse r;
  ASSERT_TRUE(Infer(*stub, q, 0, &r).ok());
  EXPECT_EQ(r.model_version(), 1);
  EXPECT_LT(Error(*v1_model, q, FromProto(r.output())), 1e-5);
  // A folder written in place is loaded only once unchanged across two polls.
  auto v4_model = RandomModel(4);
  testing::WriteModelDir(*v4_model, repo + "/m/4");
  server->repository()->Poll();
  EXPECT_EQ(server->repository()->Find("m")->version, 1);
  server->repository()->Poll();
  EXPECT_EQ(server->repository()->Find("m")->version, 4);
  // Entries starting with ".." (a projected volume's swap) are ignored.
  fs::create_directories(repo + "/..data");
  fs::create_directories(repo + "/m/..5");
  server->repository()->Poll();
  server->repository()->Poll();
  EXPECT_EQ(server->repository()->Find("m")->version, 4);
  EXPECT_FALSE(server->repository()->Known("..data"));
  server->Drain();
}

// A repository that is a Kubernetes projected volume: every name links
// through "..data" into a timestamped folder, and an update swaps "..data".
TEST(ModelVersionsTest, ProjectedVolumeSwapServesTheNewVersion) {
  const std::string repo = NewRepo("projected");
  auto v1_model = RandomModel(51);
  testing::WriteModelDir(*v1_model, repo + "/..2026_11_24_14_00_00.1/m/1");
  fs::create_directory_symlink("..2026_11_24_14_00_00.1", repo + "/..data");
  fs::create_directory_symlink("..data/m", repo + "/m");
  auto server = Start(repo, ModelControl::kPoll);
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  std::mt19937 rng(9);
  const Tensor q = RandomTensor({1, 3, kE}, rng);
  v1::InferResponse r;
  ASSERT_TRUE(Infer(*stub, q, 0, &r).ok());
  EXPECT_EQ(r.model_version(), 1);
  EXPECT_LT(Error(*v1_model, q, FromProto(r.output())), 1e-5);
  // The kubelet writes the new contents (versions 1 and 2) to a new folder
  // and renames a new "..data" link over the old one.
  const std::string next = repo + "/..2026_11_24_14_05_00.2/m";
  testing::WriteModelDir(*v1_model, next + "/1");
  auto v2_model = RandomModel(52);
  testing::WriteModelDir(*v2_model, next + "/2");
  fs::create_directory_symlink("..2026_11_24_14_05_00.2", repo + "/..data_tmp");
  fs::rename(repo + "/..data_tmp", repo + "/..data");
  fs::remove_all(repo + "/..2026_11_24_14_00_00.1");
  server->repository()->Poll();
  server->repository()->Poll();
  ASSERT_TRUE(Infer(*stub, q, 0, &r).ok());
  EXPECT_EQ(r.model_version(), 2);
  EXPECT_LT(Error(*v2_model, q, FromProto(r.output())), 1e-5);
  const auto index = server->repository()->Index();
  EXPECT_FALSE(index.empty());
  for (const auto& v : index) EXPECT_EQ(v.model, "m");  // No "..data" or "..2026..." model.
  EXPECT_EQ(LoadCount(*server, "m", "2", "success"), 1);
  server->Drain();
}

TEST(ModelVersionsTest, UnloadDrainsQueuedRequestsThenFreesTheVersion) {
  const std::string repo = NewRepo("unload");
  fs::create_directories(repo + "/m");
  auto model = WriteVersion(repo + "/m", 1, 5, "\"max_batch_size\": 1");
  auto server = Start(repo, ModelControl::kExplicit);
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  std::mt19937 rng(3);
  const Tensor q = RandomTensor({1, 4, kE}, rng);
  constexpr int kQueued = 4;
  struct Call {
    grpc::ClientContext context;
    v1::InferRequest request;
    v1::InferResponse response;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  absl::Mutex mu;
  int answered = 0;  // Guarded by mu.
  {
    // Batches wait on the compute lock: one takes the first request, the
    // rest queue.
    absl::MutexLock hold(server->repository()->compute_mutex());
    for (int i = 0; i < kQueued; ++i) {
      auto call = std::make_unique<Call>();
      call->request.set_model("m");
      ToProto(q, call->request.mutable_query());
      Call* c = call.get();
      stub->async()->Infer(&c->context, &c->request, &c->response, [&, c](grpc::Status s) {
        c->status = s;
        absl::MutexLock lock(&mu);
        ++answered;
      });
      calls.push_back(std::move(call));
    }
    ASSERT_TRUE(Eventually([&] { return server->repository()->queued() == kQueued - 1; }));
    v1::UnloadModelRequest unload;
    unload.set_name("m");
    v1::UnloadModelResponse unloaded;
    grpc::ClientContext context;
    const grpc::Status s = stub->UnloadModel(&context, unload, &unloaded);
    ASSERT_TRUE(s.ok()) << s.error_message();
    v1::InferResponse r;
    const grpc::Status after = Infer(*stub, q, 0, &r);
    EXPECT_EQ(after.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(after.error_message().find("unloaded"), std::string::npos) << after.error_message();
    EXPECT_GT(server->repository()->resident_bytes(), 0);  // Held by its requests.
  }
  ASSERT_TRUE(Eventually([&] {
    absl::MutexLock lock(&mu);
    return answered == kQueued;
  }));
  for (const auto& c : calls) {
    EXPECT_TRUE(c->status.ok()) << c->status.error_message();
    EXPECT_EQ(c->response.model_version(), 1);
    EXPECT_LT(Error(*model, q, FromProto(c->response.output())), 1e-5);
  }
  EXPECT_TRUE(Eventually([&] { return server->repository()->resident_bytes() == 0; }));
  // Loaded again on request.
  v1::LoadModelRequest load;
  load.set_name("m");
  v1::LoadModelResponse loaded;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->LoadModel(&context, load, &loaded).ok());
  ASSERT_EQ(loaded.versions_size(), 1);
  EXPECT_EQ(loaded.versions(0), 1);
  v1::InferResponse r;
  EXPECT_TRUE(Infer(*stub, q, 0, &r).ok());
  server->Drain();
}

std::string HashHex(const std::string& token) {
  const auto h = server::TokenAuthenticator::Hash(token);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(h.data()), 32));
}

TEST(ModelVersionsTest, LoadAndUnloadNeedTheAdminPermissionOnBothProtocols) {
  const std::string repo = NewRepo("admin");
  fs::create_directories(repo + "/m");
  WriteVersion(repo + "/m", 1, 6);
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
  httplib::Client rest("127.0.0.1", server->http_port());
  auto post = [&](const std::string& what, const std::string& token) {
    httplib::Headers headers;
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
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
  const std::string repo = NewRepo("sessions");
  fs::create_directories(repo + "/m");
  WriteVersion(repo + "/m", 1, 7);
  auto server = Start(repo, ModelControl::kPoll);
  auto sessions = v1::SessionService::NewStub(server->InProcessChannel());
  auto create = [&] {
    grpc::ClientContext context;
    v1::CreateSessionRequest request;
    request.set_model("m");
    request.set_kind(v1::SESSION_KIND_SELF);
    v1::SessionInfo info;
    EXPECT_TRUE(sessions->CreateSession(&context, request, &info).ok());
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
    v1::CreateSessionRequest request;
    request.set_model("m");
    request.set_kind(v1::SESSION_KIND_SELF);
    return sessions->CreateSession(&context, request, info);
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
    inference::ModelInferRequest request;
    request.set_model_name("m");
    (*request.mutable_parameters())["sequence_id"].set_uint64_param(42);
    if (start) (*request.mutable_parameters())["sequence_start"].set_bool_param(true);
    auto* input = request.add_inputs();
    input->set_name("query");
    input->set_datatype("FP32");
    for (int64_t d : rows.shape()) input->add_shape(d);
    request.add_raw_input_contents(
        std::string(static_cast<const char*>(rows.data()), rows.num_bytes()));
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
  httplib::Client rest("127.0.0.1", server->http_port());
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

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(ModelVersionsTest, RepeatedSwapsDoNotGrowMemory) {
  const std::string repo = NewRepo("rss");
  fs::create_directories(repo + "/m");
  // 4 x 2048 x 2048 float32 weights: 64 MiB a version, swapped 100 times.
  constexpr int64_t kWide = 2048;
  constexpr int64_t kSwaps = 100;
  testing::WriteModelDir(*RandomModel(9, kWide), repo + "/m/1");
  auto server = Start(repo, ModelControl::kPoll, [](ServerOptions& o) {
    o.repository.warmup = false;
    o.max_inflight_bytes = int64_t{256} << 20;
  });
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  std::mt19937 rng(5);
  const Tensor q = RandomTensor({1, 4, kWide}, rng);
  const int64_t one = static_cast<int64_t>(fs::file_size(repo + "/m/1/model.safetensors"));
  int64_t first = 0;
  for (int64_t v = 2; v <= 1 + kSwaps; ++v) {
    const std::string tmp = repo + "/m/..tmp";
    fs::create_directories(tmp);
    for (const char* f : {"config.json", "model.safetensors"}) {  // Linked: no copy to write.
      fs::create_hard_link(repo + "/m/" + std::to_string(v - 1) + "/" + f, tmp + "/" + f);
    }
    fs::rename(tmp, repo + "/m/" + std::to_string(v));
    server->repository()->Poll();
    server->repository()->Poll();
    ASSERT_EQ(server->repository()->Find("m")->version, v);
    fs::remove_all(repo + "/m/" + std::to_string(v - 1));
    v1::InferResponse r;
    ASSERT_TRUE(Infer(*stub, q, 0, &r).ok());
    EXPECT_EQ(r.model_version(), v);
    ASSERT_TRUE(Eventually([&] { return server->repository()->resident_bytes() == one; }));
    if (v == 2) first = ResidentBytes();
  }
  const int64_t last = ResidentBytes();
  std::cout << "RSS after the first swap " << first << " bytes, after " << kSwaps << ": " << last
            << "\n";
  EXPECT_LE(last, first + first / 10);
  server->Drain();
  server.reset();
  fs::remove_all(repo);  // 64 MiB of weights.
}

}  // namespace
}  // namespace attention
