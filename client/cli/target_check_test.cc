#include "client/cli/target_check.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attention::client {
namespace {

using ::testing::HasSubstr;

TEST(TargetCheckTest, AcceptsWhatGrpcReadsAsMeant) {
  for (const char* target :
       {"localhost:50051", "127.0.0.1:1", "[::1]:50051", "dns:///attention:50051",
        "dns://8.8.8.8/attention:443", "dns:attention:50051", "ipv4:127.0.0.1:1,127.0.0.1:2",
        "ipv6:[::1]:50051", "unix:/tmp/attention.sock", "unix:///tmp/a.sock", "xds:///svc"}) {
    EXPECT_TRUE(TargetCheck::Check(target).ok())
        << target << ": " << TargetCheck::Check(target).message();
  }
}

TEST(TargetCheckTest, RefusesUrlsWithTheRightForm) {
  absl::Status s = TargetCheck::Check("http://localhost:50651");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "--server 'http://localhost:50651': a URL; a gRPC target is host:port: use --server "
            "localhost:50651");
  s = TargetCheck::Check("https://attention.example.com/v1");
  EXPECT_THAT(s.message(), HasSubstr("use --server attention.example.com:50051 --tls"));
  EXPECT_THAT(TargetCheck::Check("grpc://h:7").message(), HasSubstr("use --server h:7"));
}

TEST(TargetCheckTest, RefusesATargetWithoutAPort) {
  absl::Status s = TargetCheck::Check("localhost");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "--server 'localhost': no port (gRPC would use 443): give host:port, e.g. "
            "'localhost:50051'");
  EXPECT_THAT(TargetCheck::Check("dns:///attention").message(), HasSubstr("no port"));
  EXPECT_THAT(TargetCheck::Check("ipv4:127.0.0.1:1,127.0.0.1").message(), HasSubstr("no port"));
  EXPECT_THAT(TargetCheck::Check("localhost:").message(), HasSubstr("no port"));
  EXPECT_THAT(TargetCheck::Check("::1").message(), HasSubstr("IPv6 address goes in brackets"));
  EXPECT_THAT(TargetCheck::Check("localhost:http").message(),
              HasSubstr("port 'http': expected a number from 1 to 65535"));
  EXPECT_THAT(TargetCheck::Check("h:70000").message(), HasSubstr("port '70000'"));
  EXPECT_FALSE(TargetCheck::Check("").ok());
}

TEST(TargetCheckTest, FirstAddress) {
  auto a = TargetCheck::FirstAddress("ipv4:10.0.0.1:5,10.0.0.2:6");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->host, "10.0.0.1");
  EXPECT_EQ(a->port, 5);
  a = TargetCheck::FirstAddress("dns:///[::1]:7");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 7);
  EXPECT_FALSE(TargetCheck::FirstAddress("unix:/tmp/s").has_value());
}

TEST(TargetCheckTest, NamesOneServer) {
  for (const char* one : {"127.0.0.1:5", "[::1]:5", "ipv4:10.0.0.1:5", "ipv6:[::1]:5",
                          "[fe80::1%eth0]:5", "unix:/tmp/s", "unix-abstract:s", "vsock:3:5"}) {
    EXPECT_TRUE(TargetCheck::NamesOneServer(one)) << one;
  }
  for (const char* several : {"localhost:5", "dns:///svc:5", "svc.ns.svc.cluster.local:5",
                              "ipv4:10.0.0.1:5,10.0.0.2:5", "ipv6:[::1]:5,[::2]:5", "10.0.0.1",
                              "10.0.0.1:", "10.0.0.1:x", "10.0.0.1:5 ", "abc:5", ""}) {
    EXPECT_FALSE(TargetCheck::NamesOneServer(several)) << several;
  }
}

}  // namespace
}  // namespace attention::client
