// File: tests/server_fixture.h
//
// The shared fixture of the server tests: one AttentionServer per test
// binary (prometheus' exposer is slow to stop) serving three small models
// from a temporary repository, with request builders and the engine's solo
// results to compare against.
#ifndef ATTENTION_TESTS_SERVER_FIXTURE_H_
#define ATTENTION_TESTS_SERVER_FIXTURE_H_

#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <random>

#include "attention/v1/attention.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "tests/server_test_util.h"
#include "tests/test_util.h"

namespace attention {

using ::attention::server::AttentionServer;
using ::attention::server::ServerOptions;
using ::attention::testing::FromProto;
using ::attention::testing::RandomMask;
using ::attention::testing::RandomTensor;
using ::attention::testing::ToProto;

// One server for the whole suite (prometheus' exposer is slow to stop).
class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir =
        ::testing::TempDir() + "/server_test_models_" + std::to_string(getpid());
    std::filesystem::remove_all(dir);
    // "small": batches generously so concurrent requests share batches.
    testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(32, 4), 1), dir + "/small",
                           "\"max_batch_size\": 16, \"max_queue_delay_us\": 3000");
    MhaSpec cross = testing::SelfAttentionSpec(16, 2);
    cross.kdim = 12;
    cross.vdim = 10;
    cross.add_bias_kv = true;
    cross.add_zero_attn = true;
    testing::WriteModelDir(**MhaModel::Random(cross, 2), dir + "/cross",
                           "\"max_queue_delay_us\": 2000");
    testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(16, 2), 3),
                           dir + "/tiny_queue", "\"max_batch_size\": 1, \"max_queue_size\": 2");
    ServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    metrics_port_ = testing::FreePort();
    options.metrics_port = metrics_port_;
    options.http_port = 0;  // REST on a free port (server_rest_test).
    options.max_message_bytes = 1 << 20;
    options.repository.path = dir;
    options.repository.default_model = "small";
    options.repository.batching.max_batch_tokens = 4096;
    options.repository.compute_threads = 2;
    server_ = AttentionServer::Listen(options)->release();
    ASSERT_TRUE(server_->LoadModels().ok());
    channel_ = new std::shared_ptr<grpc::Channel>(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
  }
  static void TearDownTestSuite() {
    delete channel_;
    EXPECT_TRUE(server_->Drain());
    delete server_;
  }

  std::unique_ptr<v1::AttentionService::Stub> InProcessStub() {
    return v1::AttentionService::NewStub(server_->InProcessChannel());
  }
  std::unique_ptr<v1::AttentionService::Stub> LoopbackStub() {
    return v1::AttentionService::NewStub(*channel_);
  }
  const MhaEngine& Engine(const std::string& model) {
    return *server_->repository()->Find(model)->engine;
  }
  const server::ModelMetrics& ModelMetricsOf(const std::string& model) {
    return *server_->repository()->Find(model)->metrics;
  }
  static double Count(const server::ModelMetrics& m, absl::StatusCode code) {
    return m.requests[0][static_cast<int>(code)]->Value();
  }

  static AttentionServer* server_;
  static std::shared_ptr<grpc::Channel>* channel_;
  static int metrics_port_;
};

inline AttentionServer* ServerTest::server_ = nullptr;
inline std::shared_ptr<grpc::Channel>* ServerTest::channel_ = nullptr;
inline int ServerTest::metrics_port_ = 0;

// A self-attention request for "small" with random data and options.
struct RequestCase {
  Tensor query, kpm, mask;
  v1::InferRequest request;
};

inline RequestCase MakeCase(std::mt19937& rng, int index) {
  RequestCase c;
  const int64_t n = 1 + index % 3, l = 1 + (index * 7) % 13;
  c.query = RandomTensor({n, l, 32}, rng);
  ToProto(c.query, c.request.mutable_query());
  c.request.set_model("small");
  c.request.set_request_id("r" + std::to_string(index));
  if (index % 2 == 0) {
    c.kpm = RandomMask({n, l}, rng, 0.3);
    ToProto(c.kpm, c.request.mutable_key_padding_mask());
  }
  if (index % 3 == 1) {
    c.mask = RandomTensor({n * 4, l, l}, rng, 1.0f);  // Per-head float mask.
    ToProto(c.mask, c.request.mutable_attn_mask());
  } else if (index % 3 == 2) {
    c.mask = RandomMask({l, l}, rng, 0.2);
    ToProto(c.mask, c.request.mutable_attn_mask());
  }
  c.request.set_is_causal(index % 4 == 3);
  c.request.set_need_weights(index % 5 == 0);
  c.request.set_per_head_weights(index % 10 == 0);
  return c;
}

// The engine's own result for a request run alone.
inline MhaOutputs Solo(const MhaEngine& engine, const RequestCase& c) {
  MhaInputs in;
  in.query = c.query.view();
  if (c.request.has_key_padding_mask()) in.key_padding_mask = c.kpm.view();
  if (c.request.has_attn_mask()) in.attn_mask = c.mask.view();
  in.is_causal = c.request.is_causal();
  in.need_weights = c.request.need_weights();
  in.average_attn_weights = !c.request.per_head_weights();
  return *engine.Forward(in);
}

inline void ExpectClose(const Tensor& expected, const v1::Tensor& actual, double atol) {
  Tensor got = FromProto(actual);
  ASSERT_EQ(got.shape(), expected.shape());
  for (int64_t i = 0; i < got.num_elements(); ++i) {
    ASSERT_NEAR(got.as<float>()[i], expected.as<float>()[i], atol) << "element " << i;
  }
}

}  // namespace attention

#endif  // ATTENTION_TESTS_SERVER_FIXTURE_H_
