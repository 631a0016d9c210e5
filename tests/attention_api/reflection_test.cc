// Server reflection over grpc.reflection.v1 and v1alpha, with generated
// stubs against an in-process AttentionServer: every listed service resolves
// to files that rebuild into a fresh DescriptorPool (so their dependencies are
// complete), health included; errors are NOT_FOUND; both versions answer
// alike; extensions (on a pool made here); and the authentication hook, on
// its own and as --auth_probes.
#include <unistd.h>

#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/descriptor_database.h>
#include <google/protobuf/text_format.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "server/frontends/grpc/reflection_service.h"
#include "server/security/token_authenticator.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::server::AttentionServer;
using ::attention::server::ServerOptions;

// One reflection protocol version: its stub, messages and our service.
struct V1 {
  using Reflection = grpc::reflection::v1::ServerReflection;
  using Request = grpc::reflection::v1::ServerReflectionRequest;
  using Response = grpc::reflection::v1::ServerReflectionResponse;
  using Service = server::ReflectionServiceV1;
};
struct V1Alpha {
  using Reflection = grpc::reflection::v1alpha::ServerReflection;
  using Request = grpc::reflection::v1alpha::ServerReflectionRequest;
  using Response = grpc::reflection::v1alpha::ServerReflectionResponse;
  using Service = server::ReflectionServiceV1Alpha;
};

std::string TestDir() {
  return ::testing::TempDir() + "/reflection_test_" + std::to_string(getpid());
}

// A server with one small model (a test server's options: no metrics port);
// `tweak` adjusts options.
std::unique_ptr<AttentionServer> StartServer(void (*tweak)(ServerOptions&) = nullptr) {
  testing::ModelFolder models("reflection_test_models");
  models.Add("small", testing::SelfAttentionSpec(16, 2), 1);
  ServerOptions options = testing::TestServerOptions(models.path());
  options.drain_grace = absl::Milliseconds(500);  // The library's default.
  options.repository.default_model = "small";
  if (tweak != nullptr) tweak(options);
  return testing::StartServer(options);
}

// Sends `requests` on one stream, each answered before the next is sent, then
// half-closes; returns the answers and sets `status` to the stream's.
template <typename V>
std::vector<typename V::Response> Exchange(const std::shared_ptr<grpc::Channel>& channel,
                                           const std::vector<typename V::Request>& requests,
                                           grpc::Status* status, const std::string& token = "") {
  auto stub = V::Reflection::NewStub(channel);
  grpc::ClientContext context;
  testing::PrepareContext(context, token, absl::Seconds(20));
  auto stream = stub->ServerReflectionInfo(&context);
  std::vector<typename V::Response> responses;
  for (const typename V::Request& request : requests) {
    typename V::Response response;
    if (!stream->Write(request) || !stream->Read(&response)) break;
    responses.push_back(std::move(response));
  }
  stream->WritesDone();
  *status = stream->Finish();
  return responses;
}

template <typename V>
typename V::Request SymbolRequest(const std::string& symbol) {
  typename V::Request request;
  request.set_file_containing_symbol(symbol);
  return request;
}

// The files of a file_descriptor_response, each named once, in a fresh pool.
class RebuiltFiles {
 public:
  template <typename Response>
  explicit RebuiltFiles(const Response& response) {
    EXPECT_TRUE(response.has_file_descriptor_response()) << response.DebugString();
    std::set<std::string> names;
    for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
      google::protobuf::FileDescriptorProto file;
      EXPECT_TRUE(file.ParseFromString(bytes));
      EXPECT_TRUE(names.insert(file.name()).second) << file.name() << " twice";
      if (first_.empty()) first_ = file.name();
      EXPECT_TRUE(database_.Add(file));
    }
  }
  // The requested file, built with every dependency from the response only.
  const google::protobuf::FileDescriptor* First() { return pool_.FindFileByName(first_); }
  const google::protobuf::DescriptorPool& pool() const { return pool_; }

 private:
  google::protobuf::SimpleDescriptorDatabase database_;
  google::protobuf::DescriptorPool pool_{&database_};
  std::string first_;
};

class ReflectionServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = StartServer().release(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static AttentionServer* server_;
};
AttentionServer* ReflectionServerTest::server_ = nullptr;

template <typename V>
class ReflectionTest : public ReflectionServerTest {
 protected:
  std::vector<typename V::Response> Ask(const std::vector<typename V::Request>& requests) {
    grpc::Status status;
    auto responses = Exchange<V>(server_->InProcessChannel(), requests, &status);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(responses.size(), requests.size());
    return responses;
  }
  std::vector<std::string> ListServices() {
    typename V::Request request;
    request.set_host("localhost:50051");
    request.set_list_services("");
    const auto responses = Ask({request});
    if (responses.empty()) return {};
    EXPECT_EQ(responses[0].valid_host(), "localhost:50051");
    EXPECT_EQ(responses[0].original_request().SerializeAsString(), request.SerializeAsString());
    std::vector<std::string> names;
    for (const auto& s : responses[0].list_services_response().service()) names.push_back(s.name());
    return names;
  }
};
using Versions = ::testing::Types<V1, V1Alpha>;
TYPED_TEST_SUITE(ReflectionTest, Versions);

TYPED_TEST(ReflectionTest, ListsEveryRegisteredService) {
  // Others too (inference.GRPCInferenceService once registered); each resolves
  // (EveryListedServiceRebuildsFromItsFiles).
  const std::vector<std::string> names = this->ListServices();
  EXPECT_THAT(names, ::testing::IsSupersetOf(
                         {"attention.v1.AttentionService", "attention.v1.SessionService",
                          "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                          "grpc.reflection.v1alpha.ServerReflection"}));
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
}

TYPED_TEST(ReflectionTest, EveryListedServiceRebuildsFromItsFiles) {
  const std::vector<std::string> services = this->ListServices();
  ASSERT_FALSE(services.empty());
  std::vector<typename TypeParam::Request> requests;
  for (const std::string& name : services) requests.push_back(SymbolRequest<TypeParam>(name));
  const auto responses = this->Ask(requests);  // All on one stream.
  ASSERT_EQ(responses.size(), services.size());
  for (size_t i = 0; i < services.size(); ++i) {
    SCOPED_TRACE(services[i]);
    RebuiltFiles files(responses[i]);
    ASSERT_NE(files.First(), nullptr) << "a dependency is missing";
    const auto* service = files.pool().FindServiceByName(services[i]);
    ASSERT_NE(service, nullptr);
    EXPECT_EQ(service->file(), files.First());
    ASSERT_GT(service->method_count(), 0);
    for (int m = 0; m < service->method_count(); ++m) {
      const auto* method = service->method(m);
      EXPECT_NE(files.pool().FindMessageTypeByName(method->input_type()->full_name()), nullptr);
      EXPECT_NE(files.pool().FindMessageTypeByName(method->output_type()->full_name()), nullptr);
    }
  }
}

TYPED_TEST(ReflectionTest, SymbolsOfEveryKindResolveToTheirFile) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"attention.v1.AttentionService", "attention/v1/attention.proto"},
      {"attention.v1.AttentionService.Infer", "attention/v1/attention.proto"},
      {"attention.v1.SessionService.SessionStream", "attention/v1/sessions.proto"},
      {"attention.v1.InferRequest", "attention/v1/attention.proto"},
      {"attention.v1.InferRequest.query", "attention/v1/attention.proto"},
      {"attention.v1.DataType", "attention/v1/attention.proto"},
      {"grpc.health.v1.Health", "grpc/health/v1/health.proto"},
      {"grpc.health.v1.Health.Watch", "grpc/health/v1/health.proto"},
      {"grpc.health.v1.HealthCheckResponse", "grpc/health/v1/health.proto"},
      {"grpc.health.v1.HealthCheckResponse.ServingStatus", "grpc/health/v1/health.proto"},
      {"grpc.health.v1.HealthCheckResponse.SERVING", "grpc/health/v1/health.proto"},
      {"grpc.reflection.v1.ServerReflection", "grpc/reflection/v1/reflection.proto"},
      {"grpc.reflection.v1alpha.ServerReflection", "grpc/reflection/v1alpha/reflection.proto"},
      {"google.protobuf.DescriptorProto.ExtensionRange", "google/protobuf/descriptor.proto"},
  };
  std::vector<typename TypeParam::Request> requests;
  for (const auto& [symbol, file] : cases) requests.push_back(SymbolRequest<TypeParam>(symbol));
  const auto responses = this->Ask(requests);
  ASSERT_EQ(responses.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].first);
    RebuiltFiles files(responses[i]);
    ASSERT_NE(files.First(), nullptr);
    EXPECT_EQ(files.First()->name(), cases[i].second);
    EXPECT_NE(files.pool().FindFileContainingSymbol(cases[i].first), nullptr);
  }
}

TYPED_TEST(ReflectionTest, HealthFileByName) {
  typename TypeParam::Request request;
  request.set_file_by_filename("grpc/health/v1/health.proto");
  const auto responses = this->Ask({request});
  ASSERT_EQ(responses.size(), 1u);
  RebuiltFiles files(responses[0]);
  ASSERT_NE(files.First(), nullptr);
  EXPECT_EQ(files.First()->name(), "grpc/health/v1/health.proto");
  EXPECT_NE(files.pool().FindMethodByName("grpc.health.v1.Health.Check"), nullptr);
}

TYPED_TEST(ReflectionTest, UnknownNamesAreNotFoundAndTheStreamGoesOn) {
  typename TypeParam::Request symbol = SymbolRequest<TypeParam>("attention.v1.NoSuchThing");
  typename TypeParam::Request file;
  file.set_file_by_filename("no/such.proto");
  typename TypeParam::Request extension;
  extension.mutable_file_containing_extension()->set_containing_type("attention.v1.InferRequest");
  extension.mutable_file_containing_extension()->set_extension_number(1000);
  typename TypeParam::Request numbers;
  numbers.set_all_extension_numbers_of_type("no.such.Type");
  typename TypeParam::Request empty;  // No message_request at all.
  const auto responses = this->Ask(
      {symbol, file, extension, numbers, empty, SymbolRequest<TypeParam>("grpc.health.v1.Health")});
  ASSERT_EQ(responses.size(), 6u);
  const std::vector<std::string> messages = {
      "symbol not found: 'attention.v1.NoSuchThing'", "file not found: 'no/such.proto'",
      "extension not found: number 1000 of 'attention.v1.InferRequest'",
      "message type not found: 'no.such.Type'"};
  for (size_t i = 0; i < messages.size(); ++i) {
    ASSERT_TRUE(responses[i].has_error_response()) << responses[i].DebugString();
    EXPECT_EQ(responses[i].error_response().error_code(), 5);  // NOT_FOUND
    EXPECT_EQ(responses[i].error_response().error_message(), messages[i]);
  }
  EXPECT_EQ(responses[4].error_response().error_code(), 12);  // UNIMPLEMENTED
  EXPECT_TRUE(responses[5].has_file_descriptor_response());
}

// Extensions, on a pool with a proto2 message extended by two files.
TYPED_TEST(ReflectionTest, Extensions) {
  google::protobuf::DescriptorPool pool;
  for (const char* text : {
           R"pb(name: "test/base.proto"
                package: "test"
                message_type {
                  name: "Base"
                  extension_range { start: 100 end: 200 }
                })pb",
           R"pb(name: "test/ext.proto"
                package: "test"
                dependency: "test/base.proto"
                extension {
                  name: "top"
                  number: 123
                  label: LABEL_OPTIONAL
                  type: TYPE_INT32
                  extendee: ".test.Base"
                }
                message_type {
                  name: "Holder"
                  extension {
                    name: "nested"
                    number: 150
                    label: LABEL_OPTIONAL
                    type: TYPE_STRING
                    extendee: ".test.Base"
                  }
                })pb"}) {
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &file));
    ASSERT_NE(pool.BuildFile(file), nullptr);
  }
  const typename TypeParam::Service service({}, nullptr, &pool);
  typename TypeParam::Request request;
  request.set_all_extension_numbers_of_type("test.Base");
  auto response = service.Answer(request);
  EXPECT_EQ(response.all_extension_numbers_response().base_type_name(), "test.Base");
  EXPECT_THAT(response.all_extension_numbers_response().extension_number(),
              ::testing::UnorderedElementsAre(123, 150));
  for (const int number : {123, 150}) {
    request.mutable_file_containing_extension()->set_containing_type("test.Base");
    request.mutable_file_containing_extension()->set_extension_number(number);
    RebuiltFiles files(service.Answer(request));
    ASSERT_NE(files.First(), nullptr);
    EXPECT_EQ(files.First()->name(), "test/ext.proto");
    EXPECT_NE(files.pool().FindFileByName("test/base.proto"), nullptr);
  }
  request.mutable_file_containing_extension()->set_extension_number(124);
  EXPECT_EQ(service.Answer(request).error_response().error_code(), 5);
  request.set_file_containing_symbol("test.Holder.nested");
  RebuiltFiles nested(service.Answer(request));
  ASSERT_NE(nested.First(), nullptr);
  EXPECT_EQ(nested.First()->name(), "test/ext.proto");
  // With no names given, the reflection services list themselves.
  request.set_list_services("");
  EXPECT_EQ(service.Answer(request).list_services_response().service_size(), 2);
}

// The hook decides per stream; refused streams end with its status.
TYPED_TEST(ReflectionTest, AuthenticationHook) {
  typename TypeParam::Service service({"x.Y"}, [](const grpc::CallbackServerContext* context) {
    const auto& metadata = context->client_metadata();
    const auto it = metadata.find("authorization");
    if (it == metadata.end() || it->second != "Bearer good") {
      return absl::UnauthenticatedError("reflection needs a token");
    }
    return absl::OkStatus();
  });
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  const std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  typename TypeParam::Request list;
  list.set_list_services("");
  for (const std::string token : {"", "bad"}) {
    grpc::Status status;
    EXPECT_TRUE(Exchange<TypeParam>(server->InProcessChannel({}), {list}, &status, token).empty());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(status.error_message(), "reflection needs a token");
  }
  grpc::Status status;
  const auto responses = Exchange<TypeParam>(server->InProcessChannel({}), {list}, &status, "good");
  EXPECT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(responses.size(), 1u);
  EXPECT_EQ(responses[0].list_services_response().service(0).name(), "x.Y");
  server->Shutdown();
}

// v1 and v1alpha give the same answers, byte for byte.
TEST_F(ReflectionServerTest, BothVersionsAnswerAlike) {
  std::vector<V1::Request> v1_requests(5);
  v1_requests[0].set_list_services("");
  v1_requests[1].set_file_containing_symbol("attention.v1.SessionService");
  v1_requests[2].set_file_by_filename("grpc/health/v1/health.proto");
  v1_requests[3].set_file_containing_symbol("nope");
  v1_requests[4].set_all_extension_numbers_of_type("attention.v1.Tensor");
  std::vector<V1Alpha::Request> v1alpha_requests;
  for (const V1::Request& r : v1_requests) {
    v1alpha_requests.emplace_back();
    ASSERT_TRUE(v1alpha_requests.back().ParseFromString(r.SerializeAsString()));
  }
  grpc::Status v1_status, v1alpha_status;
  const auto v1 = Exchange<V1>(server_->InProcessChannel(), v1_requests, &v1_status);
  const auto v1alpha =
      Exchange<V1Alpha>(server_->InProcessChannel(), v1alpha_requests, &v1alpha_status);
  ASSERT_TRUE(v1_status.ok() && v1alpha_status.ok());
  ASSERT_EQ(v1.size(), v1_requests.size());
  ASSERT_EQ(v1alpha.size(), v1_requests.size());
  for (size_t i = 0; i < v1.size(); ++i) {
    EXPECT_EQ(v1[i].SerializeAsString(), v1alpha[i].SerializeAsString()) << i;
  }
  EXPECT_TRUE(v1[4].has_all_extension_numbers_response());
}

// --auth_probes: reflection, like health, needs a valid token.
TEST(ReflectionAuthProbesTest, ReflectionNeedsATokenToo) {
  std::filesystem::create_directories(TestDir());
  static const std::string tokens = TestDir() + "/tokens";
  {
    const server::TokenAuthenticator::Sha256 hash =
        server::TokenAuthenticator::Hash("probe-secret");
    std::ofstream out(tokens);
    out << absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(hash.data()), 32))
        << " probe *\n";
  }
  auto server = StartServer([](ServerOptions& o) {
    o.auth_tokens_file = tokens;
    o.auth_probes = true;
  });
  ASSERT_NE(server, nullptr);
  V1::Request list;
  list.set_list_services("");
  V1Alpha::Request list_alpha;
  list_alpha.set_list_services("");
  for (const std::string token : {"", "wrong"}) {
    grpc::Status status;
    Exchange<V1>(server->InProcessChannel(), {list}, &status, token);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << token;
    Exchange<V1Alpha>(server->InProcessChannel(), {list_alpha}, &status, token);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << token;
  }
  grpc::Status status;
  const auto responses = Exchange<V1>(server->InProcessChannel(), {list}, &status, "probe-secret");
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(responses.size(), 1u);
  std::vector<std::string> names;
  for (const auto& s : responses[0].list_services_response().service()) names.push_back(s.name());
  EXPECT_THAT(names, ::testing::Contains("grpc.reflection.v1.ServerReflection"));
}

}  // namespace
}  // namespace attention
