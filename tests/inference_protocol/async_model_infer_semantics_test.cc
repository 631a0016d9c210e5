// Review probes of what ModelInfer answers on gRPC's async API
// (AsyncModelInferCall), against the callback path it replaced: a sequence
// step large enough for the parse pool appends exactly; every refusal kind
// is counted once and leaves nothing in flight; a token uses only its
// models; every model variant's output equals attention.v1 Infer's.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/mha_engine.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/attention_server.h"
#include "server/batching/model_bytes.h"
#include "server/frontends/grpc/async_unary_call.h"
#include "tests/fixture/async_infer_test_util.h"
#include "tests/fixture/token_files.h"
#include "tests/inference_protocol/async_model_infer_probes.h"

namespace attention {
namespace {

using namespace ::attention::async_infer_testing;  // NOLINT: the helpers.
using namespace ::attention::oip_async_probes;     // NOLINT: the helpers.
using server::AsyncUnaryCall;

TEST_F(AsyncModelInferProbeTest, LargeSequenceStepIsParsedOffTheQueueAndAppendsExactly) {
  ASSERT_TRUE(Start(SmallServerOptions("rev_oip_seq_large")));
  std::mt19937 rng(11);
  constexpr int64_t kFirst = 4400, kSecond = 3, E = 16;
  const Tensor tokens = RandomTensor({1, kFirst + kSecond, E}, rng);
  MhaInputs in;
  in.query = tokens.view();
  in.is_causal = true;
  const MhaOutputs whole = *server_->repository()->Find("small")->engine->Forward(in);
  const Tensor first = Tensor::FromBytes(DType::kFloat32, {1, kFirst, E}, tokens.data());
  const Tensor second =
      Tensor::FromBytes(DType::kFloat32, {1, kSecond, E},
                        static_cast<const char*>(tokens.data()) + kFirst * E * sizeof(float));
  ModelInferRequest a = Request(first, "a"), b = Request(second, "b");
  Step(&a, 7, /*start=*/true, /*end=*/false);
  Step(&b, 7, /*start=*/false, /*end=*/true);
  ASSERT_GT(static_cast<int64_t>(a.ByteSizeLong()), AsyncUnaryCall::kInlineParseBytes);
  ModelInferResponse ra, rb;
  const grpc::Status sa = Call(oip_.get(), a, &ra);
  ASSERT_TRUE(sa.ok()) << sa.error_message();
  EXPECT_EQ(server_->infer_queue().parse_pool().posted(), 1);
  const grpc::Status sb = Call(oip_.get(), b, &rb);
  ASSERT_TRUE(sb.ok()) << sb.error_message();
  ASSERT_EQ(rb.raw_output_contents_size(), 1);
  ASSERT_EQ(rb.raw_output_contents(0).size(), kSecond * E * sizeof(float));
  const float* got = reinterpret_cast<const float*>(rb.raw_output_contents(0).data());
  for (int64_t i = 0; i < kSecond * E; ++i) {
    ASSERT_NEAR(got[i], whole.output.as<float>()[kFirst * E + i], 1e-5) << i;
  }
  EXPECT_EQ(rb.model_version(), "1");
  EXPECT_EQ(Answered(absl::StatusCode::kOk), 2);
  EXPECT_TRUE(WaitFor([&] { return server_->metrics().inflight_requests().Value() == 0; }));
  EXPECT_TRUE(server_->Drain());
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
}

TEST_F(AsyncModelInferProbeTest, EveryRefusalIsCountedOnceAndLeavesNothingInFlight) {
  server::ServerOptions options = SmallServerOptions("rev_oip_refusals");
  options.max_inflight_bytes = 400 << 10;
  ASSERT_TRUE(Start(options));
  std::mt19937 rng(12);
  ModelInferResponse response;
  // Unknown version: refused before a model is found.
  ModelInferRequest r = Request(RandomTensor({1, 4, 16}, rng), "v");
  r.set_model_version("9");
  EXPECT_EQ(Call(oip_.get(), r, &response).error_code(), grpc::StatusCode::NOT_FOUND);
  // A sequence that was never started: NOT_FOUND, the model counts it.
  r = Request(RandomTensor({1, 4, 16}, rng), "s");
  Step(&r, 99, false, false);
  const grpc::Status unknown = Call(oip_.get(), r, &response);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND) << unknown.error_message();
  // An id too long.
  r = Request(RandomTensor({1, 4, 16}, rng), std::string(2000, 'x'));
  EXPECT_EQ(Call(oip_.get(), r, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Inline, over the in-flight budget with its response: the model counts it.
  r = Request(RandomTensor({1, 3500, 16}, rng), "budget");
  ASSERT_LE(static_cast<int64_t>(r.ByteSizeLong()), AsyncUnaryCall::kInlineParseBytes);
  const grpc::Status over = Call(oip_.get(), r, &response);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << over.error_message();
  // Too large to wait in the pool inside the budget.
  r = Request(RandomTensor({1, 7000, 16}, rng), "pool-budget");
  EXPECT_EQ(Call(oip_.get(), r, &response).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(Answered(absl::StatusCode::kNotFound), 1);
  EXPECT_EQ(Answered(absl::StatusCode::kInvalidArgument), 1);
  EXPECT_EQ(Answered(absl::StatusCode::kResourceExhausted), 1);
  EXPECT_TRUE(WaitFor([&] { return server_->metrics().inflight_requests().Value() == 0; }))
      << server_->metrics().inflight_requests().Value();
  EXPECT_EQ(server_->service().inflight_bytes(), 0);
  EXPECT_TRUE(server_->Drain());
}

// A token limited to some models: ModelInfer of another is PERMISSION_DENIED
// (inline and from the parse pool), of its own OK, as on the callback path.
TEST_F(AsyncModelInferProbeTest, ATokenUsesOnlyItsModels) {
  testing::ModelFolder models("rev_oip_tokens");
  models.Add("small", testing::SelfAttentionSpec(16, 2), 1);
  models.Add("other", testing::SelfAttentionSpec(16, 2), 2);
  server::ServerOptions options = testing::TestServerOptions(models.path(), /*rest=*/true);
  options.auth_tokens_file = models.path() + ".tokens";
  testing::WriteTokens(options.auth_tokens_file,
                       absl::StrCat(testing::HashHex("alice-secret"), " alice small\n"));
  ASSERT_TRUE(Start(options));
  std::mt19937 rng(17);
  for (const Tensor& query : {RandomTensor({1, 4, 16}, rng), RandomTensor({80, 64, 16}, rng)}) {
    ModelInferRequest r = Request(query, "t");
    ModelInferResponse response;
    grpc::ClientContext own;
    own.AddMetadata("authorization", "Bearer alice-secret");
    const grpc::Status mine = Call(oip_.get(), r, &response, &own);
    EXPECT_TRUE(mine.ok()) << mine.error_message();
    r.set_model_name("other");
    grpc::ClientContext theirs;
    theirs.AddMetadata("authorization", "Bearer alice-secret");
    const grpc::Status denied = Call(oip_.get(), r, &response, &theirs);
    EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED) << denied.error_message();
    EXPECT_NE(denied.error_message().find("'alice' may not use model 'other'"), std::string::npos)
        << denied.error_message();
  }
  EXPECT_EQ(Answered(absl::StatusCode::kOk), 2);
  EXPECT_TRUE(WaitFor([&] { return server_->metrics().inflight_requests().Value() == 0; }));
  EXPECT_TRUE(server_->Drain());
}

// Every model variant (kdim/vdim != E with bias_kv and zero_attn, bfloat16
// compute) through ModelInfer, inline and from the parse pool: the output
// equals attention.v1 Infer's for the same inputs.
TEST_F(AsyncModelInferProbeTest, EveryVariantEqualsAttentionV1) {
  testing::ModelFolder models("rev_oip_variants");
  models.Add("cross", testing::CrossSpec(), 2);
  MhaSpec bf16 = testing::SelfAttentionSpec(16, 2);
  bf16.compute_dtype = DType::kBFloat16;
  models.Add("bf16", bf16, 3);
  MhaSpec kv = testing::SelfAttentionSpec(16, 2);
  kv.add_bias_kv = kv.add_zero_attn = true;
  models.Add("kv", kv, 4);
  ASSERT_TRUE(Start(testing::TestServerOptions(models.path(), /*rest=*/true)));
  std::mt19937 rng(18);
  for (const char* model : {"cross", "bf16", "kv"}) {
    const MhaSpec& spec = server_->repository()->Find(model)->model->spec();
    for (int64_t batch : {int64_t{1}, int64_t{80}}) {  // Inline, then the parse pool.
      const Tensor q = RandomTensor({batch, 64, spec.embed_dim}, rng);
      const Tensor k = RandomTensor({batch, 64, spec.kdim}, rng);
      const Tensor v = RandomTensor({batch, 64, spec.vdim}, rng);
      const bool cross = spec.kdim != spec.embed_dim;
      v1::InferRequest v1_request;
      v1_request.set_model(model);
      ToProto(q, v1_request.mutable_query());
      ModelInferRequest r = Request(q, model);
      r.set_model_name(model);
      if (cross) {
        ToProto(k, v1_request.mutable_key());
        ToProto(v, v1_request.mutable_value());
        for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"key", &k},
                                      std::pair<const char*, const Tensor*>{"value", &v}}) {
          auto* input = r.add_inputs();
          input->set_name(name);
          input->set_datatype("FP32");
          input->mutable_shape()->Assign(t->shape().begin(), t->shape().end());
          r.add_raw_input_contents(
              std::string(static_cast<const char*>(t->data()), t->num_bytes()));
        }
      }
      v1::InferResponse v1_response;
      const grpc::Status v1_status = InferOnce(stub_.get(), v1_request, &v1_response);
      ASSERT_TRUE(v1_status.ok()) << model << ": " << v1_status.error_message();
      ModelInferResponse response;
      const grpc::Status status = Call(oip_.get(), r, &response);
      ASSERT_TRUE(status.ok()) << model << ": " << status.error_message();
      const Tensor expected = testing::FromProto(v1_response.output()).ConvertTo(DType::kFloat32);
      ASSERT_EQ(response.raw_output_contents_size(), 1);
      const Shape shape(response.outputs(0).shape().begin(), response.outputs(0).shape().end());
      ASSERT_EQ(shape, expected.shape()) << model;
      const DType dtype =
          response.outputs(0).datatype() == "BF16" ? DType::kBFloat16 : DType::kFloat32;
      const Tensor got = Tensor::FromBytes(dtype, shape, response.raw_output_contents(0).data())
                             .ConvertTo(DType::kFloat32);
      for (int64_t i = 0; i < got.num_elements(); ++i) {
        ASSERT_NEAR(got.as<float>()[i], expected.as<float>()[i], 1e-6)
            << model << " batch " << batch << " element " << i;
      }
      EXPECT_EQ(response.model_version(), "1");
    }
  }
  EXPECT_TRUE(server_->Drain());
}

}  // namespace
}  // namespace attention
