// Where the server listens and what it logs, in process: an IPv6 host in
// gRPC's bracketed syntax ("[::1]", the wildcard "[::]") passes the port
// probe and is served (the probe once refused it for any non-zero port);
// a failed request is one request-log line that a caller's model name
// cannot forge, an OK one none; and the request log's rate window renews
// after the wall clock is set back. (A negative --metrics_port is checked
// on the binary: tests/process/server_process_test.)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <iostream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "attention/v1/attention.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "server/requests/request_log.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::server::AttentionServer;
using ::testing::HasSubstr;

constexpr int64_t kE = 16;

// A TCP port on ::1 that was free a moment ago (0 if IPv6 is unavailable).
int FreeIpv6Port() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  addr.sin6_port = 0;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin6_port);
  }
  close(fd);
  return port;
}

// One model "small" (E=16) in a folder named `name`, the default model, with
// a small session memory, on `host`:`port` (the test servers' options).
server::ServerOptions Options(const std::string& name, const std::string& host = "127.0.0.1",
                              int port = 0) {
  testing::ModelFolder models(name);
  models.Add("small", testing::SelfAttentionSpec(kE, 2), 1);
  server::ServerOptions options = testing::TestServerOptions(models.path());
  options.host = host;
  options.port = port;
  options.drain_grace = absl::Milliseconds(500);  // The library's default.
  options.repository.default_model = "small";
  options.sessions.memory_bytes = 1 << 20;
  return options;
}

// gRPC's address syntax (and the README's "listen address") writes an IPv6
// host in brackets, which getaddrinfo() cannot resolve as it is: the port
// probe must take the brackets off (port 0 skips the probe, so a non-zero
// port is what checks it).
TEST(Ipv6ListenTest, ListensOnABracketedIpv6Host) {
  const int port = FreeIpv6Port();
  if (port == 0) GTEST_SKIP() << "no IPv6 loopback here";
  std::unique_ptr<AttentionServer> server =
      testing::StartServer(Options("ipv6_host", "[::1]", port));
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->port(), port);
  // And it serves there.
  auto channel = testing::PlainChannel("[::1]:" + std::to_string(port));
  grpc::ClientContext context;
  testing::PrepareContext(context);
  v1::ListModelsResponse models;
  const grpc::Status status =
      v1::AttentionService::NewStub(channel)->ListModels(&context, {}, &models);
  EXPECT_TRUE(status.ok()) << status.error_message();
  server->Drain();
}

// The wildcard form of the same: "--host=[::]" (every IPv6 and, dual-stack,
// IPv4 address).
TEST(Ipv6ListenTest, ListensOnTheBracketedIpv6Wildcard) {
  const int port = FreeIpv6Port();
  if (port == 0) GTEST_SKIP() << "no IPv6 here";
  auto listening = AttentionServer::Listen(Options("ipv6_any", "[::]", port));
  ASSERT_TRUE(listening.ok()) << listening.status();
  (*listening)->Drain();
}

// An Infer of a zero query of `model` ("": the default).
grpc::Status InferZeros(v1::AttentionService::Stub& stub, const std::string& model) {
  v1::InferRequest request;
  request.set_model(model);
  testing::ToProto(Tensor(DType::kFloat32, {1, 2, kE}), request.mutable_query());
  grpc::ClientContext context;
  v1::InferResponse response;
  return stub.Infer(&context, request, &response);
}

// A caller's model name reaches the log inside the reason, which RequestLog
// makes printable, and as the model= field of a model not served, one field
// with every byte but [A-Za-z0-9._-:/@+] as '?'. One failed request, one
// line; an OK request, no line.
TEST(RequestLogTest, AFailedRequestIsOneLogLineAndAnOkOneNone) {
  std::unique_ptr<AttentionServer> s = testing::StartServer(Options("request_log"));
  ASSERT_NE(s, nullptr);
  auto stub = v1::AttentionService::NewStub(testing::PlainChannel(*s));
  std::ostringstream captured;
  std::streambuf* const previous = std::cerr.rdbuf(captured.rdbuf());
  EXPECT_EQ(InferZeros(*stub, "x\nFAKE request failed: OK attention.v1.AttentionService/Infer")
                .error_code(),
            grpc::StatusCode::NOT_FOUND);
  const grpc::Status ok = InferZeros(*stub, "");
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  std::cerr.rdbuf(previous);
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(captured.str(), '\n', absl::SkipEmpty())) {
    if (absl::StrContains(line, "request failed")) lines.emplace_back(line);
  }
  ASSERT_EQ(lines.size(), 1u) << captured.str();
  EXPECT_THAT(lines[0], HasSubstr("NOT_FOUND attention.v1.AttentionService/Infer "
                                  "model=x?FAKE?request?failed:?OK?attention.v1.AttentionService/"
                                  "Infer caller=-"));
  EXPECT_THAT(lines[0], HasSubstr("'x?FAKE"));
  s->Drain();
}

// RequestLog's window is measured on absl::Now(), a wall clock: after the
// clock is set back (NTP step, VM resume), now - window_start_ would stay
// negative until the clock caught up, the window would never renew and every
// failure past the lines of that window would be held back for as long as
// the step. A new window begins at the latest a second after the last one by
// the log's own count of time.
TEST(RequestLogTest, RecoversFromAClockSetBack) {
  std::ostringstream out;
  absl::Time now = absl::FromUnixSeconds(1800000000);
  server::RequestLog log(&out, /*lines_per_second=*/2, [&now] { return now; });
  for (int i = 0; i < 2; ++i) {
    log.Failed(server::Method::kInfer, "m", "-", "-", absl::UnavailableError("x"));
  }
  now -= absl::Hours(1);    // The clock is set back.
  now += absl::Seconds(5);  // Five real seconds later.
  log.Failed(server::Method::kInfer, "m", "-", "-", absl::UnavailableError("after the step"));
  EXPECT_THAT(out.str(), HasSubstr("after the step"))
      << "nothing is logged until the clock is back where it was";
}

}  // namespace
}  // namespace attention
