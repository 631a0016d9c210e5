// The REST front-end's HTTP server where it meets the rest of the server,
// from an adversarial review of the Beast rewrite (issue 35): an exchange a
// handler drops unanswered, HTTP/1.0 keep-alive, and the drain's one deadline
// for both ports. Each failed on wt-rest before its fix (see each test).
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/attention_server.h"
#include "server/frontends/rest/http_server.h"
#include "tests/fixture/raw_http_connection.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::server::HeadDecision;
using ::attention::server::HttpExchange;
using ::attention::server::HttpHandler;
using ::attention::server::HttpRequest;
using ::attention::server::HttpResponse;
using ::attention::server::HttpServer;
using ::attention::server::HttpServerOptions;
using ::attention::testing::HttpStatuses;
using ::attention::testing::RawHttpConnection;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// /drop: the exchange is dropped unanswered (a handler's bug, or a callback
// a component destroys uncalled); anything else: 200 with the body's size.
class ReviewHandler : public HttpHandler {
 public:
  HeadDecision OnHead(const HttpRequest& head) override {
    if (head.path == "/upload") upload_head_.Notify();
    return {};
  }
  void Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) override {
    if (request.path == "/drop") return;
    HttpResponse response;
    response.body = absl::StrCat(request.method, " ", request.path, " ", request.body.size());
    exchange->Reply(std::move(response));
  }

  absl::Notification upload_head_;  // /upload's head was read.
};

class HttpServerReviewTest : public ::testing::Test {
 protected:
  void Serve() {
    options_.host = "127.0.0.1";
    options_.port = 0;
    auto server = HttpServer::Start(options_, &handler_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }

  HttpServerOptions options_;
  ReviewHandler handler_;
  std::unique_ptr<HttpServer> server_;
};

// HttpExchange promises "dropped unanswered answers 500", but the connection
// held its exchange (exchange_) while the exchange held the connection: the
// cycle kept both alive, the client waited for ever (the disconnect watch has
// no deadline) and only the drain broke it.
TEST_F(HttpServerReviewTest, AnExchangeDroppedUnansweredIsAnswered500) {
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send("GET /drop HTTP/1.1\r\nHost: a\r\n\r\n"));
  const std::string answer = c.ReadResponse();  // Bounded by its 20 s read timeout.
  EXPECT_THAT(HttpStatuses(answer), ElementsAre(500)) << answer;
  EXPECT_THAT(answer, HasSubstr("not answered"));
}

// An HTTP/1.0 client keeps its connection only when the answer says
// "Connection: keep-alive" (RFC 9112 9.3 and its appendix C.2.2; ApacheBench's
// -k, for one, waits for it). The answer was HTTP/1.1 with no Connection
// header while the server kept the connection open: such a client waited for
// the close (the idle timeout) after every answer.
TEST_F(HttpServerReviewTest, AnHttp10KeepAliveAnswerSaysKeepAlive) {
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send("GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  const std::string first = c.ReadResponse();
  EXPECT_THAT(HttpStatuses(first), ElementsAre(200)) << first;
  EXPECT_THAT(absl::AsciiStrToLower(first), HasSubstr("connection: keep-alive")) << first;
  // And the connection is kept: a second request on it is answered.
  ASSERT_TRUE(c.Send("GET /b HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  EXPECT_THAT(c.ReadResponse(), HasSubstr("GET /b 0"));
  // Without keep-alive an HTTP/1.0 connection is closed after its answer.
  RawHttpConnection d(server_->port());
  ASSERT_TRUE(d.Send("GET /c HTTP/1.0\r\n\r\n"));
  const std::string closed = d.ReadToEnd();
  EXPECT_THAT(HttpStatuses(closed), ElementsAre(200)) << closed;
}

// RFC 9112 3.2.2: "a server MUST accept the absolute-form in requests". The
// path was taken from the target as sent ("http://a/b"), so every route
// answered 404 to a client that sends the absolute form (as some do through
// a forward proxy).
TEST_F(HttpServerReviewTest, AnAbsoluteFormTargetIsServedByItsPath) {
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send("GET http://a:8000/v2/x?y=1 HTTP/1.1\r\nHost: a:8000\r\n\r\n"));
  EXPECT_THAT(c.ReadResponse(), HasSubstr("GET /v2/x 0"));
  ASSERT_TRUE(c.Send("GET HTTPS://a HTTP/1.1\r\nHost: a\r\n\r\n"));
  EXPECT_THAT(c.ReadResponse(), HasSubstr("GET / 0"));
}

// The drain closes each connection after its current answer; a request whose
// head was read and whose body was arriving was cut at once instead (the
// connection was "reading"), resetting an upload the server had admitted: the
// client could not tell it from a crash. Its answer (here the handler's; on
// the server, UNAVAILABLE while draining) is now written before the close.
TEST_F(HttpServerReviewTest, TheDrainAnswersARequestWhoseBodyIsArriving) {
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n01234"));
  ASSERT_TRUE(handler_.upload_head_.WaitForNotificationWithTimeout(absl::Seconds(20)));
  std::thread stop([&] { server_->Stop(absl::Seconds(20)); });
  // The drain has reached the connection (closed at once, before the fix).
  for (int i = 0; i < 10 && !c.Readable(50); ++i) {
  }
  c.Send("56789");
  const std::string answer = c.ReadToEnd();
  stop.join();
  EXPECT_THAT(HttpStatuses(answer), ElementsAre(200)) << answer;
  EXPECT_THAT(answer, HasSubstr("POST /upload 10"));
  EXPECT_THAT(absl::AsciiStrToLower(answer), HasSubstr("connection: close"));
}

// A body was charged to REST's receive budget by its declared
// Content-Length when its head was read, and the charge held while the body
// "arrived", for up to the body deadline (60 s), whether or not a byte came:
// one client that declared a large body and sent nothing held the whole
// budget, and every other client's infer body was refused 429 meanwhile
// (with tokens off, no credential is needed). gRPC's quota is charged by
// bytes received; so is REST's now (the declared size is only checked
// against what is free).
TEST(RestBudgetReviewTest, ADeclaredBodyThatNeverArrivesDoesNotHoldTheReceiveBudget) {
  testing::ModelFolder models("rest_review_budget");
  models.Add("small", testing::SelfAttentionSpec(16, 2), 1);
  server::ServerOptions o = testing::TestServerOptions(models.path(), /*rest=*/true);
  o.grpc_receive_quota_bytes = 64 << 20;  // REST's receive budget is the same size.
  o.drain_timeout = absl::Seconds(1);     // The idle body holds the drain to its end.
  auto server = testing::StartServer(o);
  ASSERT_NE(server, nullptr);
  // Declares 22 MB of JSON (charged 3 times: all but 64 bytes of the
  // budget), sends none of it.
  RawHttpConnection idle(server->http_port());
  ASSERT_TRUE(idle.Send(
      "POST /v2/models/small/infer HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
      "Content-Length: 22369600\r\n\r\n"));
  ASSERT_FALSE(idle.Readable(200));  // Admitted: the server waits for the body.
  std::string data = "0";
  for (int i = 1; i < 16; ++i) data += ",0";
  const std::string body = absl::StrCat(
      R"({"inputs":[{"name":"query","datatype":"FP32","shape":[1,1,16],"data":[)", data, "]}]}");
  RawHttpConnection c(server->http_port());
  ASSERT_TRUE(
      c.Send(absl::StrCat("POST /v2/models/small/infer HTTP/1.1\r\nHost: a\r\n"
                          "Content-Type: application/json\r\nContent-Length: ",
                          body.size(), "\r\n\r\n", body)));
  const std::string answer = c.ReadResponse();
  EXPECT_THAT(HttpStatuses(answer), ElementsAre(200)) << answer;
  EXPECT_TRUE(server->Drain());
  std::filesystem::remove_all(models.path());
}

// Model names are folder names, spaces and '+' included; clients put them in
// the URL percent-encoded (Triton's Python client quotes the name). The
// path's segments were taken as sent, so "my%20model" was not found
// (cpp-httplib decoded the path).
TEST(RestPathReviewTest, APercentEncodedModelNameIsDecoded) {
  testing::ModelFolder models("rest_review_path");
  models.Add("my model+1", testing::SelfAttentionSpec(16, 2), 1);
  server::ServerOptions o = testing::TestServerOptions(models.path(), /*rest=*/true);
  auto server = testing::StartServer(o);
  ASSERT_NE(server, nullptr);
  for (const std::string path : {"/v2/models/my%20model%2B1", "/v2/models/my%20model%2b1/ready",
                                 "/v2/models/my%20model%2B1/versions/1/config"}) {
    RawHttpConnection c(server->http_port());
    ASSERT_TRUE(c.Send(absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: a\r\n\r\n")));
    const std::string answer = c.ReadResponse();
    EXPECT_THAT(HttpStatuses(answer), ElementsAre(200)) << path << "\n" << answer;
  }
  std::string data = "0";
  for (int i = 1; i < 16; ++i) data += ",0";
  const std::string body = absl::StrCat(
      R"({"inputs":[{"name":"query","datatype":"FP32","shape":[1,1,16],"data":[)", data, "]}]}");
  RawHttpConnection c(server->http_port());
  ASSERT_TRUE(
      c.Send(absl::StrCat("POST /v2/models/my%20model%2B1/infer HTTP/1.1\r\nHost: a\r\n"
                          "Content-Type: application/json\r\nContent-Length: ",
                          body.size(), "\r\n\r\n", body)));
  const std::string answer = c.ReadResponse();
  EXPECT_THAT(HttpStatuses(answer), ElementsAre(200)) << answer;
  EXPECT_THAT(answer, HasSubstr(R"("model_name":"my model+1")"));
  EXPECT_TRUE(server->Drain());
  std::filesystem::remove_all(models.path());
}

// An inference of 4096 x 512 floats on "wide": about 25 MB of JSON out, more
// than the loopback's socket buffers hold while the client does not read.
std::string WideInfer() {
  constexpr int kBatch = 4096, kEmbed = 512;
  const std::vector<float> query(size_t{kBatch} * kEmbed, 0.37f);
  const std::string head = absl::StrCat(
      R"({"inputs":[{"name":"query","datatype":"FP32","shape":[)", kBatch, ",1,", kEmbed,
      R"(],"parameters":{"binary_data_size":)", query.size() * sizeof(float), "}}]}");
  return absl::StrCat(
      "POST /v2/models/wide/infer HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
      "Content-Type: application/octet-stream\r\nInference-Header-Content-Length: ",
      head.size(), "\r\nContent-Length: ", head.size() + query.size() * sizeof(float), "\r\n\r\n",
      head, std::string(reinterpret_cast<const char*>(query.data()), query.size() * sizeof(float)));
}

// --drain_timeout_s bounds the whole drain: REST's connections and gRPC's
// calls are cut at the same deadline. AttentionServer::Drain gave REST what
// was left of it, then computed gRPC's deadline anew from the moment REST was
// done: with a REST client not reading its answer, a gRPC stream held open
// was cut only at about twice the drain timeout. (A bound on time, with a
// second's margin either way: the defect doubled the 2 s.)
TEST(RestDrainReviewTest, AStalledRestReaderDoesNotExtendGrpcsDrainDeadline) {
  testing::ModelFolder models("rest_review_drain");
  models.Add("wide", testing::SelfAttentionSpec(512, 4), 1, "\"max_batch_tokens\": 8192");
  server::ServerOptions o = testing::TestServerOptions(models.path(), /*rest=*/true);
  o.drain_timeout = absl::Seconds(2);
  auto server = testing::StartServer(o);
  ASSERT_NE(server, nullptr);
  // REST: an answer being written to a client that stopped reading it.
  RawHttpConnection c(server->http_port());
  ASSERT_TRUE(c.Send(WideInfer()));
  ASSERT_THAT(HttpStatuses(c.ReadUntil("\r\n\r\n")), ElementsAre(200));
  // gRPC: a stream the client keeps open (one answer read: it is open on the
  // server).
  auto stub = inference::GRPCInferenceService::NewStub(testing::PlainChannel(*server));
  grpc::ClientContext context;
  auto stream = stub->ModelStreamInfer(&context);
  inference::ModelInferRequest request;
  request.set_model_name("no_such_model");
  ASSERT_TRUE(stream->Write(request));
  inference::ModelStreamInferResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_FALSE(response.error_message().empty());

  const absl::Time start = absl::Now();
  std::thread drain([&] { server->Drain(); });
  while (stream->Read(&response)) {
  }
  const absl::Duration cut = absl::Now() - start;
  drain.join();
  EXPECT_LT(cut, o.drain_timeout + absl::Seconds(1)) << "the gRPC stream outlived the drain";
  EXPECT_FALSE(stream->Finish().ok());
  std::filesystem::remove_all(models.path());
}

}  // namespace
}  // namespace attention
