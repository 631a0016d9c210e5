// File: tests/small_server_options.h
//
// The options of a small in-process server for tests that start their own:
// one model "small" (E=16, H=2) written into a fresh temporary folder named
// after `name`, loopback, free gRPC and REST ports, no metrics port, no
// drain grace, one compute thread, no warm-up. Tests then set what they
// test. Header-only; stateless.
#ifndef ATTENTION_TESTS_SMALL_SERVER_OPTIONS_H_
#define ATTENTION_TESTS_SMALL_SERVER_OPTIONS_H_

#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "tests/test_util.h"

namespace attention::testing {

inline server::ServerOptions SmallServerOptions(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
  WriteModelDir(**MhaModel::Random(SelfAttentionSpec(16, 2), 1), dir + "/small");
  server::ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.metrics_port = 0;
  o.http_port = 0;
  o.drain_grace = absl::ZeroDuration();
  o.repository.path = dir;
  o.repository.compute_threads = 1;
  o.repository.warmup = false;
  return o;
}

}  // namespace attention::testing

#endif  // ATTENTION_TESTS_SMALL_SERVER_OPTIONS_H_
