// A batch_first=False model's requests, validated in their own (L, N, E)
// layout and computed by the batch runner (which reads and writes their rows
// in that order), against the engine on the same tensors made batch-first:
// float32, bfloat16 and int8 models, cross-attention with kdim and vdim != E,
// N > 1 and L != S, weights averaged and per head, bfloat16 inputs and
// outputs, an unbatched request in the same batch.
#include "server/requests/wire_layout.h"

#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/batching/batch_runner.h"
#include "tests/fixture/test_util.h"

namespace attention::server {
namespace {

using ::attention::testing::RandomMask;
using ::attention::testing::RandomTensor;
using ::attention::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A cross-attention layer (E 16, 2 heads, kdim 12, vdim 10, bias_k/bias_v)
// loaded from a folder whose config.json has `batch_first`.
std::unique_ptr<MhaEngine> LoadEngine(bool batch_first, DType compute, bool int8) {
  MhaSpec spec;
  spec.embed_dim = 16;
  spec.num_heads = 2;
  spec.kdim = 12;
  spec.vdim = 10;
  spec.add_bias_kv = true;
  spec.compute_dtype = compute;
  spec.int8_weights = int8;
  auto random = MhaModel::Random(spec, 5);
  EXPECT_TRUE(random.ok()) << random.status();
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/wire_layout_test_", batch_first ? "bf" : "seq",
                   DTypeName(compute), int8 ? "int8" : "");
  std::filesystem::remove_all(dir);
  attention::testing::WriteModelDir(
      **random, dir, batch_first ? R"("batch_first": true)" : R"("batch_first": false)");
  auto model = MhaModel::LoadFromDirectory(dir);
  EXPECT_TRUE(model.ok()) << model.status();
  auto engine = MhaEngine::Create(*model);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

// `t` (A, B, F) as (B, A, F), in its dtype.
Tensor SwapFirstDims(const Tensor& t) {
  const int64_t a = t.dim(0), b = t.dim(1), f = t.dim(2);
  const size_t row = static_cast<size_t>(f) * DTypeSize(t.dtype());
  Tensor out = Tensor::Uninitialized(t.dtype(), {b, a, f});
  for (int64_t i = 0; i < a; ++i) {
    for (int64_t j = 0; j < b; ++j) {
      std::memcpy(static_cast<char*>(out.data()) + (j * a + i) * row,
                  static_cast<const char*>(t.data()) + (i * b + j) * row, row);
    }
  }
  return out;
}

Tensor ToDType(const Tensor& t, DType dtype) {
  Tensor out = Tensor::Uninitialized(dtype, t.shape());
  ConvertFloats(t.dtype(), t.data(), dtype, out.data(), static_cast<size_t>(t.num_elements()));
  return out;
}

std::vector<float> Floats(DType dtype, const void* data, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count));
  ConvertFloats(dtype, data, DType::kFloat32, out.data(), out.size());
  return out;
}

// One request's tensors as sent (query (L, N, E) or unbatched (L, E)).
struct Sent {
  Tensor query, key, value, kpm;
  bool need_weights = true, per_head = false;
  std::optional<DType> output_dtype;
};

MhaInputs InputsOf(const Sent& s) {
  MhaInputs in;
  in.query = s.query.view();
  in.key = s.key.view();
  in.value = s.value.view();
  if (s.kpm.rank() > 0) in.key_padding_mask = s.kpm.view();
  in.need_weights = s.need_weights;
  in.average_attn_weights = !s.per_head;
  in.output_dtype = s.output_dtype;
  return in;
}

class WireLayoutTest : public ::testing::TestWithParam<int> {};

TEST_P(WireLayoutTest, SequenceFirstRequestsEqualTheEngineOnTheSameTensorsBatchFirst) {
  const DType compute = GetParam() == 0 ? DType::kFloat32 : DType::kBFloat16;
  const bool int8 = GetParam() == 2;
  const auto engine = LoadEngine(/*batch_first=*/false, compute, int8);
  ASSERT_TRUE(SequenceFirst(*engine));
  std::mt19937 rng(3);
  std::vector<Sent> sent(3);
  // (L 5, N 3, E), (S 7, N 3, kdim), per-head weights.
  sent[0].query = RandomTensor({5, 3, 16}, rng);
  sent[0].key = RandomTensor({7, 3, 12}, rng);
  sent[0].value = RandomTensor({7, 3, 10}, rng);
  sent[0].kpm = RandomMask({3, 7}, rng, 0.3);
  sent[0].per_head = true;
  // Shorter, N 2, bfloat16 in and out, averaged weights.
  sent[1].query = ToDType(RandomTensor({4, 2, 16}, rng), DType::kBFloat16);
  sent[1].key = ToDType(RandomTensor({6, 2, 12}, rng), DType::kBFloat16);
  sent[1].value = RandomTensor({6, 2, 10}, rng);
  // Unbatched, in the same batch: (L, E) in both layouts.
  sent[2].query = RandomTensor({3, 16}, rng);
  sent[2].key = RandomTensor({4, 12}, rng);
  sent[2].value = RandomTensor({4, 10}, rng);
  sent[2].need_weights = false;

  std::vector<std::unique_ptr<PendingRequest>> batch;
  for (const Sent& s : sent) {
    auto r = std::make_unique<PendingRequest>();
    r->inputs = InputsOf(s);
    auto call = ValidateInWireLayout(*engine, r->inputs, &r->sequence_first);
    ASSERT_TRUE(call.ok()) << call.status();
    r->call = *call;
    batch.push_back(std::move(r));
  }
  EXPECT_TRUE(batch[0]->sequence_first);
  EXPECT_EQ(batch[0]->call.batch, 3);
  EXPECT_EQ(batch[0]->call.queries, 5);
  EXPECT_EQ(batch[0]->call.keys, 7);
  EXPECT_FALSE(batch[2]->sequence_first);  // Unbatched: nothing to reorder.
  BatchStats stats;
  const std::vector<RequestOutcome> outcomes = RunBatch(*engine, batch, &stats);
  ASSERT_EQ(outcomes.size(), sent.size());

  for (size_t i = 0; i < sent.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    const Sent& s = sent[i];
    const bool batched = s.query.rank() == 3;
    Tensor q, k, v;  // Batch-first.
    MhaInputs in = InputsOf(s);
    if (batched) {
      q = SwapFirstDims(s.query);
      k = SwapFirstDims(s.key);
      v = SwapFirstDims(s.value);
      in.query = q.view();
      in.key = k.view();
      in.value = v.view();
    }
    auto want = engine->Forward(in);
    ASSERT_TRUE(want.ok()) << want.status();
    const RequestOutcome& got = outcomes[i];
    ASSERT_TRUE(got.status.ok()) << got.status;
    // The output in the layout sent: (L, N, E) for a batched request.
    EXPECT_EQ(got.output.shape, s.query.shape());
    EXPECT_EQ(got.output.dtype, s.output_dtype.value_or(s.query.dtype()));
    const Tensor want_output = batched ? SwapFirstDims(want->output) : want->output.Clone();
    const std::vector<float> a =
        Floats(got.output.dtype, got.output.bytes.data(), NumElements(got.output.shape));
    const std::vector<float> b =
        Floats(want_output.dtype(), want_output.data(), want_output.num_elements());
    ASSERT_EQ(a.size(), b.size());
    // Batched with others (padded) or alone: equal up to the output's rounding.
    const double tol =
        got.output.dtype == DType::kFloat32 && compute == DType::kFloat32 ? 1e-5 : 1e-2;
    for (size_t j = 0; j < a.size(); ++j) ASSERT_NEAR(a[j], b[j], tol * (1 + std::abs(b[j]))) << j;
    // The weights as PyTorch returns them in both layouts: (N, [H,] L, S').
    ASSERT_EQ(got.attn_weights.has_value(), s.need_weights);
    if (!s.need_weights) continue;
    EXPECT_EQ(got.attn_weights->shape, want->attn_weights->shape());
    const std::vector<float> w = Floats(got.attn_weights->dtype, got.attn_weights->bytes.data(),
                                        NumElements(got.attn_weights->shape));
    const std::vector<float> ww = Floats(want->attn_weights->dtype(), want->attn_weights->data(),
                                         want->attn_weights->num_elements());
    ASSERT_EQ(w.size(), ww.size());
    for (size_t j = 0; j < w.size(); ++j) ASSERT_NEAR(w[j], ww[j], tol) << j;
  }
}

INSTANTIATE_TEST_SUITE_P(ComputeDTypes, WireLayoutTest, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == 0   ? "Float32"
                                              : info.param == 1 ? "BFloat16"
                                                                : "Int8");
                         });

TEST(WireLayoutErrorsTest, NameTheLayoutTheModelTakes) {
  const auto engine = LoadEngine(/*batch_first=*/false, DType::kFloat32, false);
  std::mt19937 rng(4);
  Sent s;
  s.query = RandomTensor({5, 3, 8}, rng);  // E is 16.
  s.key = RandomTensor({7, 3, 12}, rng);
  s.value = RandomTensor({7, 3, 10}, rng);
  bool sequence_first = true;
  const auto batch_first_note = HasSubstr("batch_first=False layout: query (L, N, E)");
  EXPECT_THAT(ValidateInWireLayout(*engine, InputsOf(s), &sequence_first),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("query: expected shape (L, N, E) [*, *, 16], got [5, 3, 8]"),
                             batch_first_note)));
  EXPECT_FALSE(sequence_first);
  s.query = RandomTensor({5, 2, 16}, rng);  // N 2, the key's is 3.
  EXPECT_THAT(ValidateInWireLayout(*engine, InputsOf(s), &sequence_first),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("key: expected shape (S, N, kdim) [*, 2, 12], got [7, 3, 12]")));
  s.query = RandomTensor({5, 3, 16}, rng);
  s.value = RandomTensor({6, 3, 10}, rng);
  EXPECT_THAT(ValidateInWireLayout(*engine, InputsOf(s), &sequence_first),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("value: expected shape (S, N, vdim) [7, 3, 10], got [6, 3, 10]")));
  s.value = RandomTensor({7, 3, 10}, rng);
  s.kpm = RandomMask({7, 3}, rng, 0.2);  // (S, N): masks keep PyTorch's (N, S).
  EXPECT_THAT(ValidateInWireLayout(*engine, InputsOf(s), &sequence_first),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("key_padding_mask: expected shape [3, 7], got [7, 3]")));
  s.kpm = Tensor();
  s.query = RandomTensor({5, 3, 1, 16}, rng);
  EXPECT_THAT(ValidateInWireLayout(*engine, InputsOf(s), &sequence_first),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("query: expected rank 3 (L, N, E) or 2 (L, E)")));
}

TEST(WireLayoutErrorsTest, BatchFirstModelsKeepTheEnginesChecks) {
  const auto engine = LoadEngine(/*batch_first=*/true, DType::kFloat32, false);
  EXPECT_FALSE(SequenceFirst(*engine));
  std::mt19937 rng(5);
  Sent s;
  s.query = RandomTensor({3, 5, 16}, rng);
  s.key = RandomTensor({3, 7, 12}, rng);
  s.value = RandomTensor({3, 7, 10}, rng);
  bool sequence_first = true;
  auto call = ValidateInWireLayout(*engine, InputsOf(s), &sequence_first);
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_FALSE(sequence_first);
  EXPECT_EQ(call->batch, 3);
  EXPECT_EQ(call->queries, 5);
  s.key = RandomTensor({7, 3, 12}, rng);
  EXPECT_THAT(ValidateInWireLayout(*engine, InputsOf(s), &sequence_first),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("key: expected shape [3, *, 12], got [7, 3, 12]")));
}

}  // namespace
}  // namespace attention::server
