// Triton's model configuration, statistics and repository extensions on the
// Open Inference Protocol (ModelConfig, ModelStatistics, RepositoryIndex),
// decoded with stubs generated from the project's .proto, whose field
// numbers are Triton's; and the stateful alias "<model>_sequence".
#include <grpcpp/grpcpp.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "tests/fixture/oip_requests.h"
#include "tests/fixture/server_fixture.h"

namespace attention {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ModelInfoTest : public ServerTest {
 protected:
  std::unique_ptr<inference::GRPCInferenceService::Stub> Stub() {
    return inference::GRPCInferenceService::NewStub(*channel_);
  }
  inference::ModelConfig Config(const std::string& name, grpc::Status* status) {
    grpc::ClientContext context;
    inference::ModelConfigRequest request;
    request.set_name(name);
    inference::ModelConfigResponse response;
    *status = Stub()->ModelConfig(&context, request, &response);
    return response.config();
  }
  inference::ModelMetadataResponse Metadata(const std::string& name, grpc::Status* status) {
    grpc::ClientContext context;
    inference::ModelMetadataRequest request;
    request.set_name(name);
    inference::ModelMetadataResponse response;
    *status = Stub()->ModelMetadata(&context, request, &response);
    return response;
  }
  inference::ModelStatisticsResponse Stats(const std::string& name, grpc::Status* status) {
    grpc::ClientContext context;
    inference::ModelStatisticsRequest request;
    request.set_name(name);
    inference::ModelStatisticsResponse response;
    *status = Stub()->ModelStatistics(&context, request, &response);
    return response;
  }
  // One query-only ModelInfer of `model` with `tokens` (1, T, E), as a step
  // of `sequence` when it is not 0 (`start` and `end` only then).
  grpc::Status Infer(const std::string& model, const Tensor& tokens, uint64_t sequence = 0,
                     bool start = false, bool end = false,
                     inference::ModelInferResponse* out = nullptr) {
    inference::ModelInferRequest r = testing::OipQuery(tokens, model);
    if (sequence != 0) testing::AsSequenceStep(r, sequence, start, end);
    grpc::ClientContext context;
    inference::ModelInferResponse response;
    const grpc::Status status = Stub()->ModelInfer(&context, r, out != nullptr ? out : &response);
    return status;
  }
};

TEST_F(ModelInfoTest, ConfigDeclaresInputsOptionalAndDynamicBatching) {
  grpc::Status status;
  const inference::ModelConfig config = Config("cross", &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(config.name(), "cross");
  EXPECT_EQ(config.max_batch_size(), 0);
  ASSERT_EQ(config.input_size(), 5);
  EXPECT_EQ(config.input(0).name(), "query");
  EXPECT_FALSE(config.input(0).optional());
  EXPECT_EQ(config.input(0).data_type(), inference::TYPE_FP32);
  EXPECT_THAT(config.input(0).dims(), ElementsAre(-1, -1, 16));
  EXPECT_EQ(config.input(1).name(), "key");  // kdim 12, vdim 10.
  EXPECT_THAT(config.input(1).dims(), ElementsAre(-1, -1, 12));
  EXPECT_THAT(config.input(2).dims(), ElementsAre(-1, -1, 10));
  for (int i = 1; i < 5; ++i) EXPECT_TRUE(config.input(i).optional()) << config.input(i).name();
  EXPECT_EQ(config.input(3).data_type(), inference::TYPE_BOOL);
  EXPECT_TRUE(config.has_dynamic_batching());
  EXPECT_FALSE(config.has_sequence_batching());
  EXPECT_EQ(config.dynamic_batching().max_queue_delay_microseconds(), 2000u);
  ASSERT_EQ(config.output_size(), 2);
  EXPECT_EQ(config.output(0).name(), "output");
  EXPECT_TRUE(config.has_model_transaction_policy());
  EXPECT_FALSE(config.model_transaction_policy().decoupled());
}

TEST_F(ModelInfoTest, TheSequenceAliasIsStatefulAndServesSequences) {
  grpc::Status status;
  const inference::ModelConfig config = Config("small_sequence", &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(config.name(), "small_sequence");
  EXPECT_TRUE(config.has_sequence_batching());
  EXPECT_FALSE(config.has_dynamic_batching());
  EXPECT_GT(config.sequence_batching().max_sequence_idle_microseconds(), 0u);
  ASSERT_EQ(config.input_size(), 1);
  EXPECT_EQ(config.input(0).name(), "query");
  // perf_analyzer sends the steps to the alias.
  std::mt19937 rng(91);
  const Tensor tokens = RandomTensor({1, 3, 32}, rng);
  inference::ModelInferResponse response;
  status = Infer("small_sequence", tokens, 77, true, true, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.model_name(), "small_sequence");
  // An unknown name is still NOT_FOUND, with a message.
  Config("nope_sequence", &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_FALSE(status.error_message().empty());
}

// perf_analyzer takes the model name it sends requests to and the tensors it
// must have data for from ModelMetadata, and only their optional flags from
// ModelConfig: the alias's metadata must name the alias and list the query
// alone, or perf_analyzer asks for key/value/mask data ("missing tensor
// attn_mask") and addresses the stateless model.
TEST_F(ModelInfoTest, TheSequenceAliasMetadataAgreesWithItsConfig) {
  grpc::Status status;
  const inference::ModelMetadataResponse alias = Metadata("small_sequence", &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(alias.name(), "small_sequence");
  EXPECT_THAT(alias.versions(), ElementsAre("1"));
  ASSERT_EQ(alias.inputs_size(), 1);
  EXPECT_EQ(alias.inputs(0).name(), "query");
  EXPECT_EQ(alias.inputs(0).datatype(), "FP32");
  EXPECT_THAT(alias.inputs(0).shape(), ElementsAre(-1, -1, 32));
  ASSERT_EQ(alias.outputs_size(), 2);
  EXPECT_EQ(alias.outputs(0).name(), "output");
  const inference::ModelConfig config = Config("small_sequence", &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(config.input_size(), alias.inputs_size());
  EXPECT_EQ(config.input(0).name(), alias.inputs(0).name());
  // The stateless model keeps its own name and every input.
  const inference::ModelMetadataResponse plain = Metadata("small", &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(plain.name(), "small");
  std::vector<std::string> inputs;
  for (const auto& t : plain.inputs()) inputs.push_back(t.name());
  EXPECT_THAT(inputs, ElementsAre("query", "key", "value", "key_padding_mask", "attn_mask"));
  Metadata("nope_sequence", &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ModelInfoTest, StatisticsCountWhatWasServed) {
  grpc::Status status;
  const auto before = Stats("tiny_queue", &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(before.model_stats_size(), 1);
  std::mt19937 rng(92);
  const Tensor two = RandomTensor({2, 3, 16}, rng);
  ASSERT_TRUE(Infer("tiny_queue", two).ok());
  ASSERT_TRUE(Infer("tiny_queue", RandomTensor({1, 3, 8}, rng)).error_code() !=
              grpc::StatusCode::OK);  // Wrong width: a failure.
  const auto after = Stats("tiny_queue", &status);
  ASSERT_TRUE(status.ok());
  const auto& b = before.model_stats(0);
  const auto& a = after.model_stats(0);
  EXPECT_EQ(a.name(), "tiny_queue");
  EXPECT_EQ(a.version(), "1");
  EXPECT_EQ(a.inference_stats().success().count(), b.inference_stats().success().count() + 1);
  EXPECT_GT(a.inference_stats().success().ns(), b.inference_stats().success().ns());
  EXPECT_EQ(a.inference_stats().fail().count(), b.inference_stats().fail().count() + 1);
  EXPECT_EQ(a.execution_count(), b.execution_count() + 1);
  EXPECT_EQ(a.inference_count(), b.inference_count() + 2);  // Two items.
  EXPECT_EQ(a.inference_stats().queue().count(), b.inference_stats().queue().count() + 1);
  // Triton's clients require the three compute counts equal.
  EXPECT_EQ(a.inference_stats().compute_input().count(),
            a.inference_stats().compute_infer().count());
  EXPECT_EQ(a.inference_stats().compute_output().count(),
            a.inference_stats().compute_infer().count());
  EXPECT_GT(a.last_inference(), 0u);
  bool batch_of_one = false;
  for (const auto& s : a.batch_stats())
    batch_of_one |= s.batch_size() == 1 && s.compute_infer().count() > 0;
  EXPECT_TRUE(batch_of_one);
  // Every model, with no name.
  const auto all = Stats("", &status);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(all.model_stats_size(), 3);
}

TEST_F(ModelInfoTest, RepositoryIndexListsTheModelsReady) {
  grpc::ClientContext context;
  inference::RepositoryIndexRequest request;
  request.set_ready(true);
  inference::RepositoryIndexResponse response;
  const grpc::Status status = Stub()->RepositoryIndex(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<std::string> names;
  for (const auto& m : response.models()) {
    names.push_back(m.name());
    EXPECT_EQ(m.state(), "READY");
    EXPECT_EQ(m.version(), "1");
  }
  EXPECT_THAT(names, ElementsAre("cross", "small", "tiny_queue"));
  grpc::ClientContext other;
  request.set_repository_name("elsewhere");
  const grpc::Status unknown = Stub()->RepositoryIndex(&other, request, &response);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(unknown.error_message(), HasSubstr("repository_name"));
}

TEST_F(ModelInfoTest, ServerMetadataAnnouncesTheExtensions) {
  grpc::ClientContext context;
  inference::ServerMetadataResponse response;
  ASSERT_TRUE(Stub()->ServerMetadata(&context, {}, &response).ok());
  EXPECT_THAT(response.extensions(),
              ::testing::IsSupersetOf({"statistics", "model_configuration", "sequence"}));
}

}  // namespace
}  // namespace attention
