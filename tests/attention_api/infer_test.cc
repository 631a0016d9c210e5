// In-process and loopback tests of the whole serving stack: every RPC, every
// error, health, reflection and streaming (the /metrics endpoint:
// tests/monitoring/metrics_test.cc).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/fixture/server_fixture.h"

namespace attention {
namespace {

using ::testing::HasSubstr;

TEST_F(ServerTest, ListModelsAndGetModel) {
  auto stub = InProcessStub();
  grpc::ClientContext ctx;
  v1::ListModelsResponse list;
  ASSERT_TRUE(stub->ListModels(&ctx, {}, &list).ok());
  ASSERT_EQ(list.models_size(), 3);
  EXPECT_EQ(list.models(0).name(), "cross");
  EXPECT_EQ(list.models(1).name(), "small");
  EXPECT_TRUE(list.models(1).is_default());
  const v1::ModelInfo& cross = list.models(0);
  EXPECT_EQ(cross.embed_dim(), 16);
  EXPECT_EQ(cross.kdim(), 12);
  EXPECT_EQ(cross.vdim(), 10);
  EXPECT_TRUE(cross.add_bias_kv());
  EXPECT_TRUE(cross.add_zero_attn());
  EXPECT_EQ(cross.compute_dtype(), v1::DATA_TYPE_FLOAT32);
  EXPECT_EQ(cross.batching().max_queue_delay_us(), 2000);
  EXPECT_EQ(cross.batching().max_batch_tokens(), 4096);  // The server's default.

  grpc::ClientContext ctx2;
  v1::GetModelRequest get;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModel(&ctx2, get, &info).ok());  // Empty: the default.
  EXPECT_EQ(info.name(), "small");
  EXPECT_EQ(info.batching().max_batch_size(), 16);
  grpc::ClientContext ctx3;
  get.set_name("nope");
  const grpc::Status missing = stub->GetModel(&ctx3, get, &info);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(missing.error_message(), HasSubstr("'nope'"));
}

TEST_F(ServerTest, InferMatchesTheEngine) {
  auto stub = InProcessStub();
  std::mt19937 rng(7);
  for (int i = 0; i < 12; ++i) {
    RequestCase c = MakeCase(rng, i);
    grpc::ClientContext ctx;
    v1::InferResponse response;
    const grpc::Status status = stub->Infer(&ctx, c.request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.request_id(), c.request.request_id());
    MhaOutputs solo = Solo(Engine("small"), c);
    ExpectClose(solo.output, response.output(), 1e-6);
    EXPECT_EQ(response.has_attn_weights(), c.request.need_weights());
    if (c.request.need_weights()) ExpectClose(*solo.attn_weights, response.attn_weights(), 1e-6);
    EXPECT_GE(response.batch_requests(), 1);
    EXPECT_GE(response.compute_us(), 0);
  }
}

TEST_F(ServerTest, CrossAttentionUnbatchedAndDtypes) {
  auto stub = LoopbackStub();
  std::mt19937 rng(8);
  Tensor q = RandomTensor({5, 16}, rng), k = RandomTensor({7, 12}, rng),
         v = RandomTensor({7, 10}, rng);
  Tensor kpm = RandomMask({7}, rng, 0.3);
  v1::InferRequest request;
  request.set_model("cross");
  Tensor q16 = q.ConvertTo(DType::kBFloat16);
  ToProto(q16, request.mutable_query());
  ToProto(k, request.mutable_key());
  ToProto(v, request.mutable_value());
  ToProto(kpm, request.mutable_key_padding_mask());
  request.set_need_weights(true);
  request.set_per_head_weights(true);
  request.set_output_dtype(v1::DATA_TYPE_FLOAT32);
  grpc::ClientContext ctx;
  v1::InferResponse response;
  ASSERT_TRUE(stub->Infer(&ctx, request, &response).ok());
  EXPECT_EQ(response.output().dtype(), v1::DATA_TYPE_FLOAT32);
  EXPECT_THAT(response.output().shape(), ::testing::ElementsAre(5, 16));
  EXPECT_THAT(response.attn_weights().shape(), ::testing::ElementsAre(2, 5, 9));  // S' = 7 + 2.
  MhaInputs in;
  in.query = q16.view();
  in.key = k.view();
  in.value = v.view();
  in.key_padding_mask = kpm.view();
  in.need_weights = true;
  in.average_attn_weights = false;
  in.output_dtype = DType::kFloat32;
  MhaOutputs solo = *Engine("cross").Forward(in);
  ExpectClose(solo.output, response.output(), 1e-6);
  ExpectClose(*solo.attn_weights, response.attn_weights(), 1e-6);

  // No output_dtype: the query's (bfloat16).
  request.clear_output_dtype();
  grpc::ClientContext ctx2;
  ASSERT_TRUE(stub->Infer(&ctx2, request, &response).ok());
  EXPECT_EQ(response.output().dtype(), v1::DATA_TYPE_BFLOAT16);
  EXPECT_EQ(response.attn_weights().dtype(), v1::DATA_TYPE_BFLOAT16);
}

TEST_F(ServerTest, BadInputsGetSpecificErrorsAndTheServerKeepsServing) {
  auto stub = InProcessStub();
  std::mt19937 rng(9);
  RequestCase base;  // (2, 5, 32) with a bool key_padding_mask.
  base.query = RandomTensor({2, 5, 32}, rng);
  base.kpm = RandomMask({2, 5}, rng, 0.3);
  ToProto(base.query, base.request.mutable_query());
  ToProto(base.kpm, base.request.mutable_key_padding_mask());
  struct Bad {
    std::string name;
    std::function<void(v1::InferRequest&)> mutate;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Bad> cases = {
      {"unknown model", [](auto& r) { r.set_model("nope"); }, grpc::StatusCode::NOT_FOUND,
       "model: 'nope' is not served"},
      {"missing query", [](auto& r) { r.clear_query(); }, grpc::StatusCode::INVALID_ARGUMENT,
       "query: required, but the request does not set it"},
      {"short data", [](auto& r) { r.mutable_query()->mutable_data()->resize(12); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "query: data has 12 bytes but shape [2, 5, 32] of float32 needs 1280"},
      {"wrong rank",
       [](auto& r) {
         r.mutable_query()->mutable_shape()->Set(0, 1);
         r.mutable_query()->mutable_shape()->Set(1, 10);
         r.mutable_query()->add_shape(1);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "query: expected rank 3 (N, L, E) or 2 (L, E)"},
      {"embed dim",
       [](auto& r) {
         r.mutable_query()->mutable_shape()->Set(2, 16);
         r.mutable_query()->mutable_shape()->Set(1, 10);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "query: expected shape [*, *, 32], got [2, 10, 16]"},
      {"mask shape",
       [](auto& r) {
         r.mutable_key_padding_mask()->mutable_shape()->Set(1, 2);
         r.mutable_key_padding_mask()->mutable_data()->resize(4);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "key_padding_mask: expected shape [2, 5], got [2, 2]"},
      {"mask dtype", [](auto& r) { r.mutable_key_padding_mask()->set_dtype(v1::DataType(9)); },
       grpc::StatusCode::INVALID_ARGUMENT, "key_padding_mask: dtype must be"},
      {"bool query",
       [](auto& r) {
         r.mutable_query()->set_dtype(v1::DATA_TYPE_BOOL);
         r.mutable_query()->mutable_data()->resize(320);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "query: expected dtype float32, bfloat16 or float16"},
      {"attn mask shape",
       [](auto& r) {
         Tensor m(DType::kBool, {1, 5});
         ToProto(m, r.mutable_attn_mask());
       },
       grpc::StatusCode::INVALID_ARGUMENT, "attn_mask: expected shape [5, 5] or [8, 5, 5]"},
      {"negative dim", [](auto& r) { r.mutable_query()->mutable_shape()->Set(0, -2); },
       grpc::StatusCode::INVALID_ARGUMENT, "query: every dimension must be in [1, 2^31]"},
      {"output bool", [](auto& r) { r.set_output_dtype(v1::DATA_TYPE_BOOL); },
       grpc::StatusCode::INVALID_ARGUMENT, "output_dtype"},
      {"too many tokens",
       [](auto& r) {
         Tensor big(DType::kFloat32, {2, 2100, 32});
         ToProto(big, r.mutable_query());
         r.clear_key_padding_mask();
       },
       grpc::StatusCode::INVALID_ARGUMENT, "4200 query tokens (batch x length) exceed"},
      {"over message size",
       [](auto& r) {
         Tensor huge(DType::kFloat32, {1, 9000, 32});
         ToProto(huge, r.mutable_query());
       },
       grpc::StatusCode::RESOURCE_EXHAUSTED, ""},
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.name);
    v1::InferRequest request = base.request;
    bad.mutate(request);
    grpc::ClientContext ctx;
    v1::InferResponse response;
    const grpc::Status status = stub->Infer(&ctx, request, &response);
    EXPECT_EQ(status.error_code(), bad.code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(bad.message));
    grpc::ClientContext ok_ctx;  // Still serving.
    ASSERT_TRUE(stub->Infer(&ok_ctx, base.request, &response).ok());
  }
}

TEST_F(ServerTest, RandomGarbageRequestsNeverCrashOrWedgeTheServer) {
  // Requests with random dtypes, shapes, byte lengths, masks and options: each
  // must get an answer (mostly INVALID_ARGUMENT), never a crash or a hang.
  auto stub = InProcessStub();
  std::mt19937 rng(12);
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  auto random_tensor = [&](v1::Tensor* t) {
    t->set_dtype(static_cast<v1::DataType>(pick(6)));
    const int rank = pick(5);
    int64_t elements = 1;
    for (int i = 0; i < rank; ++i) {
      const int64_t d = pick(10) == 0 ? -pick(3) : 1 + pick(8);
      t->add_shape(i == rank - 1 && pick(2) ? 32 : d);
      elements *= std::max<int64_t>(d, 0);
    }
    const int64_t bytes = pick(4) == 0 ? pick(64) : std::min<int64_t>(elements * 4, 1 << 16);
    t->set_data(std::string(static_cast<size_t>(bytes), static_cast<char>(pick(256))));
  };
  std::map<grpc::StatusCode, int> codes;
  for (int i = 0; i < 300; ++i) {
    v1::InferRequest r;
    r.set_model(pick(8) == 0 ? "cross" : "small");
    random_tensor(r.mutable_query());
    if (pick(3) == 0) random_tensor(r.mutable_key());
    if (pick(3) == 0) random_tensor(r.mutable_value());
    if (pick(3) == 0) random_tensor(r.mutable_key_padding_mask());
    if (pick(3) == 0) random_tensor(r.mutable_attn_mask());
    r.set_is_causal(pick(2));
    r.set_need_weights(pick(2));
    r.set_per_head_weights(pick(2));
    r.set_output_dtype(static_cast<v1::DataType>(pick(6)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::InferResponse response;
    const grpc::Status status = stub->Infer(&ctx, r, &response);
    ++codes[status.error_code()];
    ASSERT_NE(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << "request " << i;
    ASSERT_NE(status.error_code(), grpc::StatusCode::INTERNAL) << status.error_message();
    if (!status.ok()) {
      EXPECT_FALSE(status.error_message().empty());
    }
  }
  EXPECT_GT(codes[grpc::StatusCode::INVALID_ARGUMENT], 200);
  std::mt19937 ok_rng(1);
  RequestCase c = MakeCase(ok_rng, 3);
  grpc::ClientContext ctx;
  v1::InferResponse response;
  EXPECT_TRUE(stub->Infer(&ctx, c.request, &response).ok()) << "still serving";
}

TEST_F(ServerTest, StreamCarriesManyRequestsAndPerRequestErrors) {
  auto stub = LoopbackStub();
  grpc::ClientContext ctx;
  auto stream = stub->InferStream(&ctx);
  std::mt19937 rng(10);
  std::map<std::string, RequestCase> sent;
  for (int i = 0; i < 24; ++i) {
    RequestCase c = MakeCase(rng, i);
    if (i % 6 == 5) c.request.set_model("nope");  // An error must not end the stream.
    ASSERT_TRUE(stream->Write(c.request));
    sent.emplace(c.request.request_id(), std::move(c));
  }
  stream->WritesDone();
  v1::InferResponse response;
  int ok = 0, errors = 0;
  while (stream->Read(&response)) {
    auto it = sent.find(response.request_id());
    ASSERT_NE(it, sent.end()) << response.request_id();
    if (it->second.request.model() == "nope") {
      EXPECT_EQ(response.error().code(), grpc::StatusCode::NOT_FOUND);
      EXPECT_THAT(response.error().message(), HasSubstr("not served"));
      EXPECT_FALSE(response.has_output());
      ++errors;
    } else {
      EXPECT_FALSE(response.has_error());
      ExpectClose(Solo(Engine("small"), it->second).output, response.output(), 1e-6);
      ++ok;
    }
    sent.erase(it);
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(ok, 20);
  EXPECT_EQ(errors, 4);
  EXPECT_TRUE(sent.empty());
}

// A generic bidi call to the reflection service listing the services.
class ReflectionCall : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit ReflectionCall(const std::shared_ptr<grpc::Channel>& channel) : stub_(channel) {
    // ServerReflectionRequest { list_services (field 7) = "" }.
    const char request[] = {0x3a, 0x00};
    grpc::Slice slice(request, sizeof(request));
    request_ = grpc::ByteBuffer(&slice, 1);
    stub_.PrepareBidiStreamingCall(&ctx_,
                                   "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                   grpc::StubOptions(), this);
    StartWrite(&request_);
    StartRead(&response_);
    StartCall();
  }
  void OnWriteDone(bool) override { StartWritesDone(); }
  void OnReadDone(bool ok) override {
    if (ok) {
      std::vector<grpc::Slice> slices;
      (void)response_.Dump(&slices);
      for (const auto& s : slices) body_.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }
  std::string Wait() {
    done_.WaitForNotification();
    return status_.ok() ? body_ : "error: " + status_.error_message();
  }

 private:
  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer request_, response_;
  std::string body_;
  grpc::Status status_;
  absl::Notification done_;
};

TEST_F(ServerTest, ReflectionListsTheService) {
  ReflectionCall call(*channel_);
  const std::string body = call.Wait();
  EXPECT_THAT(body, HasSubstr("attention.v1.AttentionService"));
  EXPECT_THAT(body, HasSubstr("grpc.health.v1.Health"));
}

TEST_F(ServerTest, HealthIsServing) {
  auto health = grpc::health::v1::Health::NewStub(*channel_);
  for (const std::string service : {"", "attention.v1.AttentionService"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
}

TEST(ServerLifecycleTest, NotServingUntilReadyAndUnavailableWhileDraining) {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;
  auto server = AttentionServer::Listen(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = (*server)->InProcessChannel();
  auto health = grpc::health::v1::Health::NewStub(channel);
  auto check = [&] {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckResponse resp;
    EXPECT_TRUE(health->Check(&ctx, {}, &resp).ok());
    return resp.status();
  };
  auto stub = v1::AttentionService::NewStub(channel);
  v1::InferRequest request;
  Tensor q(DType::kFloat32, {1, 4, 256});
  ToProto(q, request.mutable_query());
  auto infer = [&] {
    grpc::ClientContext ctx;
    v1::InferResponse resp;
    return stub->Infer(&ctx, request, &resp);
  };
  EXPECT_EQ(check(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(infer().error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_TRUE((*server)->LoadModels().ok());  // The demo model.
  EXPECT_EQ(check(), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_TRUE(infer().ok());
  (*server)->service().StartDraining();
  const grpc::Status draining = infer();
  EXPECT_EQ(draining.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(draining.error_message(), HasSubstr("shutting down"));
  EXPECT_TRUE((*server)->Drain());
}

TEST(ServerLifecycleTest, BadRepositoryFailsToLoad) {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;
  options.repository.path = "/nonexistent/models";
  auto server = AttentionServer::Listen(options);
  ASSERT_TRUE(server.ok());
  const absl::Status loaded = (*server)->LoadModels();
  EXPECT_EQ(loaded.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.message()), HasSubstr("/nonexistent/models"));
}

}  // namespace
}  // namespace attention
