// The Open Inference Protocol (inference.GRPCInferenceService) against the
// shared test server, with stubs generated from the project's .proto: every
// RPC, raw and typed contents, datatypes, masks and parameters, outputs equal
// to attention.v1's and to the engine's solo results, bad inputs, the stream
// extension, sequences on sessions, and both protocols sharing batches.
#include <atomic>
#include <thread>

#include "gmock/gmock.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/frontends/protocol/oip_codec.h"
#include "tests/fixture/server_fixture.h"

namespace attention {
namespace {

using inference::ModelInferRequest;
using inference::ModelInferResponse;
using ::testing::HasSubstr;

using server::OipDatatype;

// Adds `t` as input `name` in raw form.
void AddRaw(const std::string& name, const Tensor& t, ModelInferRequest* r) {
  auto* input = r->add_inputs();
  input->set_name(name);
  input->set_datatype(OipDatatype(t.dtype()));
  input->mutable_shape()->Assign(t.shape().begin(), t.shape().end());
  r->add_raw_input_contents(std::string(static_cast<const char*>(t.data()), t.num_bytes()));
}

// Adds `t` (float32 or bool) as input `name` with typed contents.
void AddTyped(const std::string& name, const Tensor& t, ModelInferRequest* r) {
  auto* input = r->add_inputs();
  input->set_name(name);
  input->set_datatype(OipDatatype(t.dtype()));
  input->mutable_shape()->Assign(t.shape().begin(), t.shape().end());
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    if (t.dtype() == DType::kBool) {
      input->mutable_contents()->add_bool_contents(t.as<bool>()[i]);
    } else {
      input->mutable_contents()->add_fp32_contents(t.as<float>()[i]);
    }
  }
}

void SetBool(const std::string& name, bool value, ModelInferRequest* r) {
  (*r->mutable_parameters())[name].set_bool_param(value);
}

// The request of `c` in the Open Inference Protocol.
ModelInferRequest FromCase(const RequestCase& c, bool typed = false) {
  ModelInferRequest r;
  r.set_model_name(c.request.model());
  r.set_id(c.request.request_id());
  auto add = typed ? AddTyped : AddRaw;
  add("query", c.query, &r);
  if (c.request.has_key_padding_mask()) add("key_padding_mask", c.kpm, &r);
  if (c.request.has_attn_mask()) add("attn_mask", c.mask, &r);
  SetBool("is_causal", c.request.is_causal(), &r);
  SetBool("need_weights", c.request.need_weights(), &r);
  SetBool("average_attn_weights", !c.request.per_head_weights(), &r);
  return r;
}

// Output `i` of `response` as float32.
Tensor OutputOf(const ModelInferResponse& response, int i) {
  const auto& meta = response.outputs(i);
  const DType dtype = meta.datatype() == "BF16"   ? DType::kBFloat16
                      : meta.datatype() == "FP16" ? DType::kFloat16
                                                  : DType::kFloat32;
  const Shape shape(meta.shape().begin(), meta.shape().end());
  Tensor t = Tensor::FromBytes(dtype, shape, response.raw_output_contents(i).data());
  return t.ConvertTo(DType::kFloat32);
}

void ExpectNear(const Tensor& expected, const Tensor& got, double atol) {
  ASSERT_EQ(got.shape(), expected.shape());
  for (int64_t i = 0; i < got.num_elements(); ++i) {
    ASSERT_NEAR(got.as<float>()[i], expected.as<float>()[i], atol) << "element " << i;
  }
}

class InferenceProtocolTest : public ServerTest {
 protected:
  std::unique_ptr<inference::GRPCInferenceService::Stub> Stub() {
    return inference::GRPCInferenceService::NewStub(*channel_);
  }
  grpc::Status Infer(const ModelInferRequest& request, ModelInferResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return Stub()->ModelInfer(&context, request, response);
  }
};

TEST_F(InferenceProtocolTest, ServerAndModelRpcs) {
  auto stub = Stub();
  {
    grpc::ClientContext c;
    inference::ServerLiveResponse r;
    ASSERT_TRUE(stub->ServerLive(&c, {}, &r).ok());
    EXPECT_TRUE(r.live());
  }
  {
    grpc::ClientContext c;
    inference::ServerReadyResponse r;
    ASSERT_TRUE(stub->ServerReady(&c, {}, &r).ok());
    EXPECT_TRUE(r.ready());
  }
  {
    grpc::ClientContext c;
    inference::ServerMetadataResponse r;
    ASSERT_TRUE(stub->ServerMetadata(&c, {}, &r).ok());
    EXPECT_EQ(r.name(), "attention-service");
    EXPECT_FALSE(r.version().empty());
    EXPECT_THAT(r.extensions(), ::testing::Contains("parameters"));
  }
  {
    grpc::ClientContext c;
    inference::ModelReadyRequest q;
    q.set_name("cross");
    inference::ModelReadyResponse r;
    ASSERT_TRUE(stub->ModelReady(&c, q, &r).ok());
    EXPECT_TRUE(r.ready());
  }
  for (const auto& [name, version] :
       {std::pair<std::string, std::string>{"nope", ""}, {"small", "2"}}) {
    grpc::ClientContext c;
    inference::ModelReadyRequest q;
    q.set_name(name);
    q.set_version(version);
    inference::ModelReadyResponse r;
    EXPECT_EQ(stub->ModelReady(&c, q, &r).error_code(), grpc::StatusCode::NOT_FOUND) << name;
  }
  grpc::ClientContext c;
  inference::ModelMetadataRequest q;
  q.set_name("cross");
  inference::ModelMetadataResponse r;
  ASSERT_TRUE(stub->ModelMetadata(&c, q, &r).ok());
  EXPECT_EQ(r.platform(), "attention_mha");
  EXPECT_THAT(r.versions(), ::testing::ElementsAre("1"));
  ASSERT_EQ(r.inputs_size(), 5);
  EXPECT_EQ(r.inputs(0).name(), "query");
  EXPECT_THAT(r.inputs(0).shape(), ::testing::ElementsAre(-1, -1, 16));
  EXPECT_THAT(r.inputs(1).shape(), ::testing::ElementsAre(-1, -1, 12));  // kdim
  EXPECT_THAT(r.inputs(2).shape(), ::testing::ElementsAre(-1, -1, 10));  // vdim
  ASSERT_EQ(r.outputs_size(), 2);
  EXPECT_EQ(r.outputs(0).name(), "output");
  EXPECT_EQ(r.outputs(1).name(), "attn_weights");
}

TEST_F(InferenceProtocolTest, RawAndTypedContentsEqualAttentionV1AndTheEngine) {
  std::mt19937 rng(21);
  auto v1_stub = LoopbackStub();
  for (int i = 0; i < 12; ++i) {
    const RequestCase c = MakeCase(rng, i);
    const MhaOutputs solo = Solo(Engine("small"), c);
    grpc::ClientContext v1_context;
    v1::InferResponse v1_response;
    ASSERT_TRUE(v1_stub->Infer(&v1_context, c.request, &v1_response).ok());
    for (bool typed : {false, true}) {
      ModelInferResponse response;
      const grpc::Status status = Infer(FromCase(c, typed), &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(response.id(), c.request.request_id());
      EXPECT_EQ(response.model_name(), "small");
      EXPECT_EQ(response.model_version(), "1");
      ASSERT_EQ(response.outputs_size(), c.request.need_weights() ? 2 : 1);
      EXPECT_EQ(response.outputs(0).name(), "output");
      ExpectNear(solo.output, OutputOf(response, 0), 1e-5);
      ExpectNear(FromProto(v1_response.output()), OutputOf(response, 0), 1e-6);
      if (c.request.need_weights()) {
        EXPECT_EQ(response.outputs(1).name(), "attn_weights");
        ExpectNear(*solo.attn_weights, OutputOf(response, 1), 1e-5);
      }
    }
  }
}

TEST_F(InferenceProtocolTest, DatatypesMasksAndParameters) {
  std::mt19937 rng(5);
  const Tensor q = RandomTensor({2, 6, 16}, rng);
  const Tensor k = RandomTensor({2, 7, 12}, rng);
  const Tensor v = RandomTensor({2, 7, 10}, rng);
  const Tensor kpm_bool = RandomMask({2, 7}, rng, 0.3);
  const Tensor kpm_float = RandomTensor({2, 7}, rng);
  const Tensor am_bool = RandomMask({6, 7}, rng, 0.2);
  const Tensor am_float = RandomTensor({2 * 2, 6, 7}, rng);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int masks = 0; masks < 2; ++masks) {
      ModelInferRequest r;
      r.set_model_name("cross");
      AddRaw("query", q.ConvertTo(dtype), &r);
      AddRaw("key", k.ConvertTo(dtype), &r);
      AddRaw("value", v.ConvertTo(dtype), &r);
      AddRaw("key_padding_mask", masks == 0 ? kpm_bool : kpm_float, &r);
      AddRaw("attn_mask", masks == 0 ? am_bool : am_float, &r);
      SetBool("average_attn_weights", false, &r);
      r.add_outputs()->set_name("attn_weights");  // Implies need_weights.
      r.add_outputs()->set_name("output");
      ModelInferResponse response;
      const grpc::Status status = Infer(r, &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      ASSERT_EQ(response.outputs_size(), 2);
      EXPECT_EQ(response.outputs(0).name(), "attn_weights");
      EXPECT_EQ(response.outputs(1).name(), "output");
      EXPECT_EQ(response.outputs(1).datatype(), OipDatatype(dtype));
      MhaInputs in;
      const Tensor qd = q.ConvertTo(dtype), kd = k.ConvertTo(dtype), vd = v.ConvertTo(dtype);
      in.query = qd.view();
      in.key = kd.view();
      in.value = vd.view();
      in.key_padding_mask = (masks == 0 ? kpm_bool : kpm_float).view();
      in.attn_mask = (masks == 0 ? am_bool : am_float).view();
      in.need_weights = true;
      in.average_attn_weights = false;
      const MhaOutputs solo = *Engine("cross").Forward(in);
      const double atol = dtype == DType::kFloat32 ? 1e-5 : 2e-2;
      ExpectNear(solo.output.ConvertTo(DType::kFloat32), OutputOf(response, 1), atol);
      ExpectNear(solo.attn_weights->ConvertTo(DType::kFloat32), OutputOf(response, 0), atol);
    }
  }
  // is_causal, and only the weights asked for.
  ModelInferRequest r;
  r.set_model_name("small");
  const Tensor sq = RandomTensor({1, 5, 32}, rng);
  AddRaw("query", sq, &r);
  SetBool("is_causal", true, &r);
  r.add_outputs()->set_name("attn_weights");
  ModelInferResponse response;
  ASSERT_TRUE(Infer(r, &response).ok());
  ASSERT_EQ(response.outputs_size(), 1);
  ASSERT_EQ(response.raw_output_contents_size(), 1);
  const Tensor w = OutputOf(response, 0);
  EXPECT_THAT(w.shape(), ::testing::ElementsAre(1, 5, 5));
  EXPECT_EQ(w.as<float>()[1], 0.0f) << "row 0 may not attend to key 1 (causal)";
}

TEST_F(InferenceProtocolTest, BadInputsAreInvalidArgumentNamingTheInput) {
  std::mt19937 rng(9);
  const Tensor q = RandomTensor({1, 4, 32}, rng);
  struct Case {
    std::string name;
    std::function<void(ModelInferRequest*)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"datatype", [](ModelInferRequest* r) { r->mutable_inputs(0)->set_datatype("INT8"); },
       "inputs[0] ('query').datatype: expected FP32, FP16, BF16 or BOOL, got 'INT8'"},
      {"size", [](ModelInferRequest* r) { r->mutable_raw_input_contents(0)->resize(12); },
       "raw_input_contents[0] ('query'): data has 12 bytes but shape [1, 4, 32] of float32 "
       "needs 512"},
      {"unknown input", [](ModelInferRequest* r) { r->mutable_inputs(0)->set_name("qurey"); },
       "inputs[0] ('qurey').name: expected one of query, key, value"},
      {"missing query",
       [&](ModelInferRequest* r) {
         r->Clear();
         r->set_model_name("small");
         AddRaw("key", q, r);
       },
       "inputs: 'query' is required"},
      {"both contents",
       [&](ModelInferRequest* r) {
         AddTyped("key", q, r);
         r->add_raw_input_contents("");
       },
       "also has raw_input_contents"},
      {"unknown output", [](ModelInferRequest* r) { r->add_outputs()->set_name("logits"); },
       "outputs[0].name: expected 'output' or 'attn_weights', got 'logits'"},
      {"parameter type",
       [](ModelInferRequest* r) { (*r->mutable_parameters())["is_causal"].set_int64_param(1); },
       "parameters['is_causal']: expected bool_param"},
      {"shape",
       [](ModelInferRequest* r) {
         r->mutable_inputs(0)->clear_shape();
         r->mutable_inputs(0)->add_shape(4);
         r->mutable_inputs(0)->add_shape(-32);
       },
       "every dimension must be in [1, 2^31]"},
      {"engine", [](ModelInferRequest* r) { r->set_model_name("cross"); }, "query"},
  };
  for (const Case& c : cases) {
    ModelInferRequest r;
    r.set_model_name("small");
    AddRaw("query", q, &r);
    c.edit(&r);
    ModelInferResponse response;
    const grpc::Status status = Infer(r, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_THAT(status.error_message(), HasSubstr(c.message)) << c.name;
  }
  ModelInferRequest r;
  r.set_model_name("nope");
  AddRaw("query", q, &r);
  ModelInferResponse response;
  EXPECT_EQ(Infer(r, &response).error_code(), grpc::StatusCode::NOT_FOUND);
  r.set_model_name("small");
  r.set_model_version("7");
  EXPECT_EQ(Infer(r, &response).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(InferenceProtocolTest, StreamAnswersEveryRequestWithItsResultOrError) {
  std::mt19937 rng(13);
  grpc::ClientContext context;
  auto stream = Stub()->ModelStreamInfer(&context);
  std::vector<RequestCase> cases;
  for (int i = 0; i < 6; ++i) {
    cases.push_back(MakeCase(rng, i));
    ModelInferRequest r = FromCase(cases.back());
    if (i == 3) r.mutable_inputs(0)->set_datatype("FP64");  // This one fails; the stream goes on.
    ASSERT_TRUE(stream->Write(r));
  }
  stream->WritesDone();
  std::map<std::string, inference::ModelStreamInferResponse> responses;
  inference::ModelStreamInferResponse response;
  while (stream->Read(&response)) responses[response.infer_response().id()] = response;
  ASSERT_TRUE(stream->Finish().ok());
  ASSERT_EQ(responses.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    const auto& got = responses[cases[i].request.request_id()];
    if (i == 3) {
      EXPECT_THAT(got.error_message(), HasSubstr("expected FP32, FP16, BF16 or BOOL"));
      continue;
    }
    ASSERT_EQ(got.error_message(), "") << i;
    ExpectNear(Solo(Engine("small"), cases[i]).output, OutputOf(got.infer_response(), 0), 1e-5);
  }
}

TEST_F(InferenceProtocolTest, SequencesAppendToASessionLikeACausalCall) {
  std::mt19937 rng(17);
  const Tensor tokens = RandomTensor({1, 9, 32}, rng);
  // The reference: one stateless causal call over all 9 tokens.
  MhaInputs in;
  in.query = tokens.view();
  in.is_causal = true;
  const MhaOutputs whole = *Engine("small").Forward(in);
  const int chunks[] = {4, 1, 4};
  int64_t at = 0;
  for (int i = 0; i < 3; ++i) {
    const Tensor chunk =
        Tensor::FromBytes(DType::kFloat32, {1, chunks[i], 32},
                          static_cast<const char*>(tokens.data()) + at * 32 * sizeof(float));
    ModelInferRequest r;
    r.set_model_name("small");
    r.set_id("step" + std::to_string(i));
    AddRaw("query", chunk, &r);
    (*r.mutable_parameters())["sequence_id"].set_uint64_param(42);
    if (i == 0) SetBool("sequence_start", true, &r);
    if (i == 2) SetBool("sequence_end", true, &r);
    ModelInferResponse response;
    const grpc::Status status = Infer(r, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    const Tensor got = OutputOf(response, 0);
    ASSERT_THAT(got.shape(), ::testing::ElementsAre(1, chunks[i], 32));
    for (int64_t t = 0; t < chunks[i]; ++t) {
      for (int64_t e = 0; e < 32; ++e) {
        ASSERT_NEAR(got.as<float>()[t * 32 + e], whole.output.as<float>()[(at + t) * 32 + e], 1e-5)
            << "token " << at + t;
      }
    }
    at += chunks[i];
  }
  // Ended: another step needs a new start.
  ModelInferRequest r;
  r.set_model_name("small");
  AddRaw("query", tokens, &r);
  (*r.mutable_parameters())["sequence_id"].set_uint64_param(42);
  ModelInferResponse response;
  const grpc::Status ended = Infer(r, &response);
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(ended.error_message(), HasSubstr("start it with sequence_start"));
}

TEST_F(InferenceProtocolTest, BothProtocolsShareBatchesAndStayExact) {
  std::mt19937 rng(23);
  std::vector<RequestCase> cases;
  std::vector<MhaOutputs> solos;
  for (int i = 0; i < 24; ++i) {
    cases.push_back(MakeCase(rng, i));
    solos.push_back(Solo(Engine("small"), cases.back()));
  }
  std::atomic<int> failures{0}, shared{0};
  std::vector<std::thread> clients;
  // One attention.v1 client at a time: a batch of more than one request it is
  // in must hold inference-protocol requests too.
  clients.emplace_back([&] {
    auto stub = LoopbackStub();
    for (int round = 0; round < 4; ++round) {
      for (size_t i = 0; i < cases.size(); ++i) {
        grpc::ClientContext context;
        v1::InferResponse response;
        if (!stub->Infer(&context, cases[i].request, &response).ok()) {
          ++failures;
          continue;
        }
        if (response.batch_requests() > 1) ++shared;
        const Tensor got = FromProto(response.output());
        for (int64_t e = 0; e < got.num_elements(); ++e) {
          if (std::abs(got.as<float>()[e] - solos[i].output.as<float>()[e]) > 1e-5) {
            ++failures;
            break;
          }
        }
      }
    }
  });
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      for (int round = 0; round < 4; ++round) {
        for (size_t i = c; i < cases.size(); i += 2) {
          ModelInferResponse response;
          if (!Infer(FromCase(cases[i]), &response).ok()) {
            ++failures;
            continue;
          }
          const Tensor got = OutputOf(response, 0);
          for (int64_t e = 0; e < got.num_elements(); ++e) {
            if (std::abs(got.as<float>()[e] - solos[i].output.as<float>()[e]) > 1e-5) {
              ++failures;
              break;
            }
          }
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(failures, 0);
  EXPECT_GT(shared, 0) << "no attention.v1 request shared a batch with the other protocol";
  const auto& metrics = ModelMetricsOf("small");
  EXPECT_GT(metrics.requests[static_cast<int>(server::Method::kModelInfer)][0]->Value(), 0);
}

}  // namespace
}  // namespace attention
