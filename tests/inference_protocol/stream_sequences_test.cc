// Triton's sequences on the Open Inference Protocol's stream
// (ModelStreamInfer): steps of a sequence on one stream are applied in the
// order sent, several sequences interleave on one stream, a bad step is that
// response's error and the stream goes on, and a sequence id is scoped per
// model. Each row is compared with the engine's stateless causal result over
// the sequence's prefix (the reference the golden tests hold to PyTorch).
#include <grpcpp/grpcpp.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "tests/fixture/oip_requests.h"
#include "tests/fixture/server_fixture.h"

namespace attention {
namespace {

using inference::ModelInferRequest;
using inference::ModelStreamInferResponse;
using ::testing::HasSubstr;

class StreamSequenceTest : public ServerTest {
 protected:
  // Step `i` of sequence `id` on `model`: tokens [at, at + count) of `tokens`.
  static ModelInferRequest Step(const std::string& model, uint64_t id, const Tensor& tokens,
                                int64_t at, int64_t count, bool start, bool end,
                                const std::string& request_id) {
    const int64_t e = tokens.dim(2);
    const Tensor chunk = Tensor::FromBytes(DType::kFloat32, {1, count, e},
                                           static_cast<const char*>(tokens.data()) + at * e * 4);
    ModelInferRequest r = testing::OipQuery(chunk, model);
    r.set_id(request_id);
    return testing::AsSequenceStep(r, id, start, end);
  }

  // Sends `requests` on one stream; the responses by id.
  std::map<std::string, ModelStreamInferResponse> Exchange(
      const std::vector<ModelInferRequest>& requests) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto stub = inference::GRPCInferenceService::NewStub(*channel_);
    auto stream = stub->ModelStreamInfer(&context);
    for (const auto& r : requests) EXPECT_TRUE(stream->Write(r));
    stream->WritesDone();
    std::map<std::string, ModelStreamInferResponse> responses;
    ModelStreamInferResponse response;
    while (stream->Read(&response)) responses[response.infer_response().id()] = response;
    EXPECT_TRUE(stream->Finish().ok());
    return responses;
  }

  // The engine's causal output over all of `tokens` (1, T, E).
  MhaOutputs Causal(const std::string& model, const Tensor& tokens) {
    MhaInputs in;
    in.query = tokens.view();
    in.is_causal = true;
    return *Engine(model).Forward(in);
  }

  // Rows [at, at + count) of `whole` against the response's output.
  static void ExpectRows(const MhaOutputs& whole, const ModelStreamInferResponse& got, int64_t at,
                         int64_t count, const std::string& what) {
    ASSERT_EQ(got.error_message(), "") << what;
    const auto& out = got.infer_response().outputs(0);
    ASSERT_THAT(out.shape(), ::testing::ElementsAre(1, count, whole.output.dim(2))) << what;
    const int64_t e = whole.output.dim(2);
    const float* rows =
        reinterpret_cast<const float*>(got.infer_response().raw_output_contents(0).data());
    for (int64_t i = 0; i < count * e; ++i) {
      ASSERT_NEAR(rows[i], whole.output.as<float>()[at * e + i], 1e-5) << what << " element " << i;
    }
  }
};

TEST_F(StreamSequenceTest, InterleavedSequencesDecodeTokenByTokenInOrder) {
  std::mt19937 rng(71);
  constexpr int kTokens = 6;
  const Tensor a = RandomTensor({1, kTokens, 32}, rng), b = RandomTensor({1, kTokens, 32}, rng);
  std::vector<ModelInferRequest> requests;
  for (int t = 0; t < kTokens; ++t) {  // a0 b0 a1 b1 ...: two sequences on one stream.
    const bool start = t == 0, end = t == kTokens - 1;
    requests.push_back(Step("small", 101, a, t, 1, start, end, "a" + std::to_string(t)));
    requests.push_back(Step("small", 102, b, t, 1, start, end, "b" + std::to_string(t)));
  }
  const auto responses = Exchange(requests);
  ASSERT_EQ(responses.size(), requests.size());
  const MhaOutputs whole_a = Causal("small", a), whole_b = Causal("small", b);
  for (int t = 0; t < kTokens; ++t) {
    ExpectRows(whole_a, responses.at("a" + std::to_string(t)), t, 1, "a" + std::to_string(t));
    ExpectRows(whole_b, responses.at("b" + std::to_string(t)), t, 1, "b" + std::to_string(t));
  }
  // Both ended with their last step: a further step needs a new start.
  const auto after = Exchange({Step("small", 101, a, 0, 1, false, false, "late")});
  EXPECT_THAT(after.at("late").error_message(), HasSubstr("start it with sequence_start"));
}

TEST_F(StreamSequenceTest, ABadStepIsItsOwnErrorAndTheStreamGoesOn) {
  std::mt19937 rng(72);
  const Tensor a = RandomTensor({1, 4, 32}, rng);
  ModelInferRequest extra = Step("small", 201, a, 1, 1, false, false, "kpm");
  auto* kpm = extra.add_inputs();  // A step takes only the query.
  kpm->set_name("key_padding_mask");
  kpm->set_datatype("BOOL");
  kpm->add_shape(1);
  kpm->add_shape(1);
  extra.add_raw_input_contents(std::string(1, '\0'));
  const auto responses = Exchange({
      Step("small", 200, a, 0, 1, false, false, "unknown"),  // Never started.
      Step("small", 201, a, 0, 2, true, false, "start"),
      extra,
      Step("small", 201, a, 2, 2, false, true, "end"),
  });
  ASSERT_EQ(responses.size(), 4u);
  EXPECT_THAT(responses.at("unknown").error_message(), HasSubstr("start it with sequence_start"));
  EXPECT_THAT(responses.at("kpm").error_message(), HasSubstr("a sequence step takes only 'query'"));
  const MhaOutputs whole = Causal("small", a);
  ExpectRows(whole, responses.at("start"), 0, 2, "start");
  ExpectRows(whole, responses.at("end"), 2, 2, "end");  // The failed step changed nothing.
}

TEST_F(StreamSequenceTest, TheSameIdOnTwoModelsIsTwoSequences) {
  std::mt19937 rng(73);
  const Tensor small = RandomTensor({1, 3, 32}, rng), tiny = RandomTensor({1, 3, 16}, rng);
  const auto responses = Exchange({
      Step("small", 7, small, 0, 1, true, false, "s0"),
      Step("tiny_queue", 7, tiny, 0, 1, true, false, "t0"),
      Step("small", 7, small, 1, 2, false, true, "s1"),
      Step("tiny_queue", 7, tiny, 1, 2, false, true, "t1"),
  });
  ASSERT_EQ(responses.size(), 4u);
  const MhaOutputs whole_small = Causal("small", small), whole_tiny = Causal("tiny_queue", tiny);
  ExpectRows(whole_small, responses.at("s0"), 0, 1, "s0");
  ExpectRows(whole_small, responses.at("s1"), 1, 2, "s1");
  ExpectRows(whole_tiny, responses.at("t0"), 0, 1, "t0");
  ExpectRows(whole_tiny, responses.at("t1"), 1, 2, "t1");
}

}  // namespace
}  // namespace attention
