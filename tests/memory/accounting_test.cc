// Allocated <= admitted (issue 21, item 3): every RPC that computes, run
// alone on an in-process server, allocates (MemoryMeter: engine workspaces,
// tensors, result buffers) no more than what admission held for it: its
// response in the in-flight budget plus its batch's working-memory estimate
// (which the batcher caps). Over model variants (kdim/vdim != E, bias_kv and
// zero_attn, bfloat16 compute), dtypes in and out, weights averaged and per
// head, refused requests included.
#include <grpcpp/grpcpp.h>

#include <functional>
#include <random>
#include <string>

#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "core/memory_meter.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/attention_server.h"
#include "server/frontends/protocol/oip_codec.h"
#include "server/requests/inflight_budget.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::testing::RandomTensor;
using ::attention::testing::ToProto;

// Expects `call(&context)`, a unary call on a fresh context, to return OK.
template <typename Call>
void ExpectOk(const Call& call) {
  grpc::ClientContext context;
  const grpc::Status status = call(&context);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// Writes `request` alone on a new stream (`open(&context)`), half-closes it,
// reads its one response into `response` and finishes it (OK).
template <typename Open, typename Request, typename Response>
void AloneOnAStream(const Open& open, const Request& request, Response* response) {
  grpc::ClientContext context;
  auto stream = open(&context);
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  ASSERT_TRUE(stream->Read(response));
  EXPECT_TRUE(stream->Finish().ok());
}

class MemoryAccountingTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    testing::ModelFolder models("memory_accounting");
    models.Add("self", testing::SelfAttentionSpec(64, 4), 1, "\"max_session_tokens\": 4096");
    MhaSpec cross = testing::SelfAttentionSpec(48, 4);
    cross.kdim = 20;
    cross.vdim = 28;
    cross.add_bias_kv = true;
    cross.add_zero_attn = true;
    models.Add("cross", cross, 2);
    MhaSpec bf16 = testing::SelfAttentionSpec(64, 8);
    bf16.compute_dtype = DType::kBFloat16;
    models.Add("bf16", bf16, 3, "\"max_session_tokens\": 4096");
    server::ServerOptions options =
        testing::TestServerOptions(models.path(), /*rest=*/false, /*compute_threads=*/2);
    options.drain_grace = absl::Milliseconds(500);  // The library's default.
    options.repository.default_model = "self";
    options.sessions.memory_bytes = int64_t{256} << 20;
    server_ = testing::StartServer(options).release();
    ASSERT_NE(server_, nullptr);
  }
  static void TearDownTestSuite() {
    EXPECT_TRUE(server_->Drain());
    delete server_;
  }

 protected:
  // Runs `call` alone; checks the bytes it allocated against what was
  // admitted for it beyond its request message (`request_bytes`).
  static void Check(const std::string& what, int64_t request_bytes,
                    const std::function<void()>& call) {
    SCOPED_TRACE(what);
    server::InflightBudget& budget = server_->service().budget();
    for (const server::ServedModel* m : server_->repository()->models()) {
      m->batcher->ResetPeakWorking();
    }
    const int64_t budget_before = budget.used();
    budget.ResetPeak();
    const int64_t meter_before = MemoryMeter::current();
    MemoryMeter::ResetPeak();
    call();
    const int64_t allocated = MemoryMeter::peak() - meter_before;
    int64_t working = 0;
    for (const server::ServedModel* m : server_->repository()->models()) {
      working = std::max(working, m->batcher->peak_working_bytes());
    }
    const int64_t admitted = budget.peak() - budget_before - request_bytes + working;
    EXPECT_LE(allocated, admitted)
        << "working estimate " << working << ", in flight " << budget.peak() - budget_before;
    // Every admitted byte is released (a stream's once its response has been
    // written, which the client may see a moment before the server does).
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (budget.used() != budget_before && absl::Now() < until)
      absl::SleepFor(absl::Milliseconds(1));
    EXPECT_EQ(budget.used(), budget_before);
    ++checked_;
  }

  static v1::InferRequest Request(const std::string& model, int64_t n, int64_t l, int64_t s,
                                  DType dtype, bool cross, int weights, bool f32_out) {
    const MhaSpec& spec = server_->repository()->Find(model)->model->spec();
    std::mt19937 rng(static_cast<uint32_t>(n * 131 + l * 7 + s));
    v1::InferRequest r;
    r.set_model(model);
    ToProto(RandomTensor({n, l, spec.embed_dim}, rng).ConvertTo(dtype), r.mutable_query());
    if (cross) {
      ToProto(RandomTensor({n, s, spec.kdim}, rng).ConvertTo(dtype), r.mutable_key());
      ToProto(RandomTensor({n, s, spec.vdim}, rng).ConvertTo(dtype), r.mutable_value());
    }
    r.set_need_weights(weights > 0);
    r.set_per_head_weights(weights == 2);
    if (f32_out) r.set_output_dtype(v1::DATA_TYPE_FLOAT32);
    return r;
  }

  static server::AttentionServer* server_;
  static int checked_;
};

server::AttentionServer* MemoryAccountingTest::server_ = nullptr;
int MemoryAccountingTest::checked_ = 0;

TEST_F(MemoryAccountingTest, InferAndInferStream) {
  auto stub = v1::AttentionService::NewStub(server_->InProcessChannel());
  auto infer_stream = [&](grpc::ClientContext* c) { return stub->InferStream(c); };
  struct Shape {
    std::string model;
    int64_t n, l, s;
    bool cross;
  };
  const Shape shapes[] = {{"self", 1, 64, 64, false},
                          {"self", 3, 300, 300, false},
                          {"cross", 2, 40, 700, true},
                          {"bf16", 2, 128, 128, false}};
  for (const Shape& sh : shapes) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (int weights = 0; weights < 3; ++weights) {
        for (bool f32_out : {false, true}) {
          const v1::InferRequest r =
              Request(sh.model, sh.n, sh.l, sh.s, dtype, sh.cross, weights, f32_out);
          const std::string what = sh.model + " " + std::to_string(sh.l) + " " +
                                   std::string(DTypeName(dtype)) + " weights " +
                                   std::to_string(weights) + (f32_out ? " f32 out" : "");
          Check("Infer " + what, static_cast<int64_t>(r.ByteSizeLong()), [&] {
            v1::InferResponse response;
            ExpectOk([&](grpc::ClientContext* c) { return stub->Infer(c, r, &response); });
          });
          if (weights != 2 || dtype != DType::kFloat16) continue;
          Check("InferStream " + what, static_cast<int64_t>(r.ByteSizeLong()), [&] {
            v1::InferResponse response;
            AloneOnAStream(infer_stream, r, &response);
            EXPECT_EQ(response.error().code(), 0) << response.error().message();
          });
        }
      }
    }
  }
  // Refused requests allocate (next to) nothing, and are released.
  v1::InferRequest bad = Request("self", 1, 8, 8, DType::kFloat32, false, 0, false);
  bad.set_model("missing");
  Check("Infer refused", 0, [&] {
    grpc::ClientContext context;
    v1::InferResponse response;
    EXPECT_EQ(stub->Infer(&context, bad, &response).error_code(), grpc::StatusCode::NOT_FOUND);
  });
  Check("InferStream refused", 0, [&] {
    v1::InferResponse response;
    AloneOnAStream(infer_stream, bad, &response);
    EXPECT_EQ(response.error().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  });
  EXPECT_GE(checked_, 80);
}

TEST_F(MemoryAccountingTest, SessionsSelfAndCross) {
  auto sessions = v1::SessionService::NewStub(server_->InProcessChannel());
  std::mt19937 rng(9);
  for (const std::string model : {"self", "bf16"}) {
    v1::CreateSessionRequest create;
    create.set_model(model);
    create.set_kind(v1::SESSION_KIND_SELF);
    v1::SessionInfo info;
    grpc::ClientContext c0;
    ASSERT_TRUE(sessions->CreateSession(&c0, create, &info).ok());
    for (int weights = 0; weights < 3; ++weights) {
      for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
        v1::AppendRequest append;
        append.set_session_id(info.session_id());
        ToProto(RandomTensor({97, 64}, rng).ConvertTo(dtype), append.mutable_tokens());
        append.set_need_weights(weights > 0);
        append.set_per_head_weights(weights == 2);
        const std::string what =
            model + " " + std::string(DTypeName(dtype)) + " weights " + std::to_string(weights);
        Check("Append " + what, static_cast<int64_t>(append.ByteSizeLong()), [&] {
          v1::AppendResponse response;
          ExpectOk([&](grpc::ClientContext* c) { return sessions->Append(c, append, &response); });
        });
        Check("SessionStream " + what, static_cast<int64_t>(append.ByteSizeLong()), [&] {
          v1::AppendResponse response;
          AloneOnAStream([&](grpc::ClientContext* c) { return sessions->SessionStream(c); }, append,
                         &response);
          EXPECT_EQ(response.error().code(), 0) << response.error().message();
        });
      }
    }
  }
  // A cross session: its creation projects the keys; then queries.
  v1::CreateSessionRequest cross;
  cross.set_model("cross");
  cross.set_kind(v1::SESSION_KIND_CROSS);
  ToProto(RandomTensor({500, 20}, rng), cross.mutable_key());
  ToProto(RandomTensor({500, 28}, rng).ConvertTo(DType::kFloat16), cross.mutable_value());
  v1::SessionInfo info;
  Check("cross CreateSession", static_cast<int64_t>(cross.ByteSizeLong()), [&] {
    ExpectOk([&](grpc::ClientContext* c) { return sessions->CreateSession(c, cross, &info); });
  });
  for (int weights = 0; weights < 3; ++weights) {
    v1::AppendRequest append;
    append.set_session_id(info.session_id());
    ToProto(RandomTensor({33, 48}, rng).ConvertTo(DType::kBFloat16), append.mutable_tokens());
    append.set_need_weights(weights > 0);
    append.set_per_head_weights(weights == 2);
    Check(
        "cross Append weights " + std::to_string(weights),
        static_cast<int64_t>(append.ByteSizeLong()), [&] {
          v1::AppendResponse response;
          ExpectOk([&](grpc::ClientContext* c) { return sessions->Append(c, append, &response); });
        });
  }
}

TEST_F(MemoryAccountingTest, InferenceProtocolAndSequences) {
  auto oip = inference::GRPCInferenceService::NewStub(server_->InProcessChannel());
  std::mt19937 rng(10);
  auto make = [&](int64_t t, DType dtype, bool weights, uint64_t sequence, bool start) {
    inference::ModelInferRequest r;
    r.set_model_name("self");
    const Tensor q = RandomTensor({1, t, 64}, rng).ConvertTo(dtype);
    auto* input = r.add_inputs();
    input->set_name("query");
    input->set_datatype(server::OipDatatype(dtype));
    input->mutable_shape()->Assign(q.shape().begin(), q.shape().end());
    r.add_raw_input_contents(std::string(static_cast<const char*>(q.data()), q.num_bytes()));
    (*r.mutable_parameters())["need_weights"].set_bool_param(weights);
    (*r.mutable_parameters())["average_attn_weights"].set_bool_param(false);
    if (sequence != 0) (*r.mutable_parameters())["sequence_id"].set_uint64_param(sequence);
    if (start) (*r.mutable_parameters())["sequence_start"].set_bool_param(true);
    return r;
  };
  for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
    for (bool weights : {false, true}) {
      const std::string what = std::string(DTypeName(dtype)) + (weights ? " weights" : "");
      const inference::ModelInferRequest r = make(150, dtype, weights, 0, false);
      Check("ModelInfer " + what, static_cast<int64_t>(r.ByteSizeLong()), [&] {
        inference::ModelInferResponse response;
        ExpectOk([&](grpc::ClientContext* c) { return oip->ModelInfer(c, r, &response); });
      });
      Check("ModelStreamInfer " + what, static_cast<int64_t>(r.ByteSizeLong()), [&] {
        inference::ModelStreamInferResponse response;
        AloneOnAStream([&](grpc::ClientContext* c) { return oip->ModelStreamInfer(c); }, r,
                       &response);
        EXPECT_EQ(response.error_message(), "");
      });
      const uint64_t sequence = weights ? 8 : 7;
      for (bool start : {true, false}) {
        const inference::ModelInferRequest step =
            make(start ? 200 : 3, dtype, weights, sequence, start);
        Check(
            "sequence " + what + (start ? " start" : " step"),
            static_cast<int64_t>(step.ByteSizeLong()), [&] {
              inference::ModelInferResponse response;
              ExpectOk([&](grpc::ClientContext* c) { return oip->ModelInfer(c, step, &response); });
            });
      }
    }
  }
}

}  // namespace
}  // namespace attention
