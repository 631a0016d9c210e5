// File: tests/security_test_fixture.h
//
// What the TLS and token tests share (server_security_test,
// server_tokens_test): a repository of two small models ("small", "other"),
// in-process servers started with tweaked options, TLS and plaintext
// channels, a small Infer, token files replaced by rename, and the
// SecurityTest fixture holding test-time certificates
// (tests/test_certificates.h). Header-only; each test binary has its own
// copies, in its own temporary folder.
#ifndef ATTENTION_TESTS_SECURITY_TEST_FIXTURE_H_
#define ATTENTION_TESTS_SECURITY_TEST_FIXTURE_H_

#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "attention/v1/attention.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "server/security/token_authenticator.h"
#include "tests/server_test_util.h"
#include "tests/test_certificates.h"
#include "tests/test_util.h"

namespace attention::security_test {

using ::attention::server::AttentionServer;
using ::attention::server::ServerOptions;
using ::attention::server::TokenAuthenticator;

inline std::string TestDir() {
  return ::testing::TempDir() + "/security_test_" + std::to_string(getpid());
}

// Two small models, "small" and "other", in a repository made once.
inline std::string ModelRepository() {
  static const std::string dir = [] {
    const std::string d = TestDir() + "/models";
    std::filesystem::remove_all(d);
    testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(16, 2), 1), d + "/small");
    testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(16, 2), 2), d + "/other");
    return d;
  }();
  return dir;
}

inline std::unique_ptr<AttentionServer> StartServer(
    const std::function<void(ServerOptions&)>& tweak) {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;
  options.max_message_bytes = 1 << 20;
  options.repository.path = ModelRepository();
  options.repository.default_model = "small";
  options.repository.compute_threads = 1;
  options.repository.warmup = false;
  tweak(options);
  auto server = AttentionServer::Listen(options);
  if (!server.ok()) {
    ADD_FAILURE() << server.status();
    return nullptr;
  }
  const absl::Status loaded = (*server)->LoadModels();
  EXPECT_TRUE(loaded.ok()) << loaded;
  return *std::move(server);
}

inline std::string Target(const AttentionServer& server) {
  return "127.0.0.1:" + std::to_string(server.port());
}

// TLS credentials trusting `ca_pem`, with an optional client certificate.
inline std::shared_ptr<grpc::Channel> TlsChannel(const std::string& target,
                                                 const std::string& ca_pem,
                                                 const std::string& cert_pem = "",
                                                 const std::string& key_pem = "") {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ca_pem;
  ssl.pem_cert_chain = cert_pem;
  ssl.pem_private_key = key_pem;
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  // Each test's channel is its own connection (no subchannel sharing), so a
  // rotated server certificate is seen by the next channel.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::SslCredentials(ssl), args);
}

inline std::shared_ptr<grpc::Channel> PlainChannel(const std::string& target) {
  return grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
}

inline v1::InferRequest SmallRequest(const std::string& model) {
  std::mt19937 rng(7);
  v1::InferRequest request;
  request.set_model(model);
  testing::ToProto(testing::RandomTensor({1, 3, 16}, rng), request.mutable_query());
  return request;
}

// Infer on `channel` with an optional bearer `token`.
inline grpc::Status Infer(const std::shared_ptr<grpc::Channel>& channel,
                          const std::string& model = "", const std::string& token = "") {
  auto stub = v1::AttentionService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  v1::InferResponse response;
  grpc::Status status = stub->Infer(&context, SmallRequest(model), &response);
  if (status.ok()) {
    EXPECT_EQ(response.output().shape_size(), 3);
  }
  return status;
}

// Polls `probe` until it returns true or `timeout` passes.
inline bool Eventually(const std::function<bool()>& probe, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (probe()) return true;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return probe();
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new testing::TestCertificates(TestDir() + "/certs");
    ASSERT_TRUE(certs_->ok()) << certs_->error();
  }
  static void TearDownTestSuite() { delete certs_; }

  static inline testing::TestCertificates* certs_ = nullptr;
};

inline std::string HashHex(const std::string& token) {
  const TokenAuthenticator::Sha256 h = TokenAuthenticator::Hash(token);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(h.data()), 32));
}

inline void WriteTokens(const std::string& path, const std::string& text) {
  // Replaced by rename, as a Kubernetes Secret update does.
  {
    std::ofstream out(path + ".new");
    out << text;
  }
  std::filesystem::rename(path + ".new", path);
}

}  // namespace attention::security_test

#endif  // ATTENTION_TESTS_SECURITY_TEST_FIXTURE_H_
