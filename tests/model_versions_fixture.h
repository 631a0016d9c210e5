// File: tests/model_versions_fixture.h
//
// What the model-version tests share (server_model_versions_test,
// server_model_lifecycle_test): random models written as version folders of
// a temporary repository, servers started on it with a model-control mode,
// polling until a condition holds, and an output's error against the
// engine's result for a given version's weights. Test-only; Error() is
// thread-safe (its engines are built once under a lock).
#ifndef ATTENTION_TESTS_MODEL_VERSIONS_FIXTURE_H_
#define ATTENTION_TESTS_MODEL_VERSIONS_FIXTURE_H_

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

namespace attention::model_versions_test {

namespace fs = std::filesystem;
using server::AttentionServer;
using server::ModelControl;
using server::ServerOptions;
using testing::FromProto;
using testing::RandomTensor;
using testing::ToProto;

inline constexpr int64_t kE = 32;

inline std::shared_ptr<const MhaModel> RandomModel(uint64_t seed, int64_t e = kE) {
  return *MhaModel::Random(testing::SelfAttentionSpec(e, 4), seed);
}

// Writes version `v` of the model in `model_dir` under a hidden name, then
// renames it into place (the documented convention).
inline std::shared_ptr<const MhaModel> WriteVersion(const std::string& model_dir, int64_t v,
                                                    uint64_t seed, const std::string& extra = "") {
  auto model = RandomModel(seed);
  const std::string tmp = model_dir + "/..tmp_" + std::to_string(v);
  testing::WriteModelDir(*model, tmp, extra);
  fs::rename(tmp, model_dir + "/" + std::to_string(v));
  return model;
}

inline std::string NewRepo(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/versions_" + name + "_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A new repository holding model "m" with version 1 (random, `seed`).
inline std::string NewModelRepo(const std::string& name, uint64_t seed) {
  const std::string repo = NewRepo(name);
  fs::create_directories(repo + "/m");
  WriteVersion(repo + "/m", 1, seed);
  return repo;
}

// The bytes of version `version`'s weights file of model "m" in `repo`.
inline int64_t ModelBytes(const std::string& repo, int64_t version) {
  return static_cast<int64_t>(
      fs::file_size(repo + "/m/" + std::to_string(version) + "/model.safetensors"));
}

inline std::unique_ptr<AttentionServer> Start(
    const std::string& repo, ModelControl control,
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
inline bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 2000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

// The engine's result for `in` on `model`. Engines are built once per model
// and kept while the model lives (a model freed and another made at its
// address gets an engine of its own). Thread-safe.
inline MhaOutputs Reference(const std::shared_ptr<const MhaModel>& model, const MhaInputs& in) {
  struct Built {
    std::weak_ptr<const MhaModel> model;
    std::unique_ptr<MhaEngine> engine;
  };
  static absl::Mutex mu;
  static auto* engines = new std::map<const MhaModel*, Built>();
  const MhaEngine* engine = nullptr;
  {
    absl::MutexLock lock(&mu);
    Built& slot = (*engines)[model.get()];
    if (slot.engine == nullptr || slot.model.lock() != model) {
      slot.model = model;
      slot.engine = *MhaEngine::Create(model);
    }
    engine = slot.engine.get();
  }
  return *engine->Forward(in);
}

// Largest |a - b| between a response's output and the engine's solo result.
inline double Error(const std::shared_ptr<const MhaModel>& model, const Tensor& query,
                    const Tensor& output) {
  MhaInputs in;
  in.query = query.view();
  const MhaOutputs want = Reference(model, in);
  double worst = 0;
  const int64_t n = NumElements(output.shape());
  if (n != NumElements(want.output.shape())) return 1e9;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max(
        worst, static_cast<double>(std::abs(output.as<float>()[i] - want.output.as<float>()[i])));
  }
  return worst;
}

inline grpc::Status Infer(v1::AttentionService::Stub& stub, const Tensor& query, int64_t version,
                          v1::InferResponse* response, const std::string& model = "m") {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::InferRequest request;
  request.set_model(model);
  request.set_model_version(version);
  ToProto(query, request.mutable_query());
  return stub.Infer(&context, request, response);
}

inline double LoadCount(AttentionServer& server, const std::string& model,
                        const std::string& version, const std::string& result) {
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

}  // namespace attention::model_versions_test

#endif  // ATTENTION_TESTS_MODEL_VERSIONS_FIXTURE_H_
