// File: tests/server_test_util.h
//
// Helpers for tests that talk to a server: request building from core
// tensors, response decoding, a free loopback port, and a plain HTTP GET.
#ifndef ATTENTION_TESTS_SERVER_TEST_UTIL_H_
#define ATTENTION_TESTS_SERVER_TEST_UTIL_H_

#include <string>

#include "attention/v1/attention.pb.h"
#include "core/tensor.h"

namespace attention::testing {

// Sets `out` to `t` (dtype, shape, bytes).
void ToProto(const Tensor& t, v1::Tensor* out);

// A copy of `t` as float32 (any float dtype).
Tensor FromProto(const v1::Tensor& t);

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort();

// The body of GET http://127.0.0.1:port/path ("" on failure).
std::string HttpGet(int port, const std::string& path);

// The value of the first sample line `name{...labels...} value` whose labels
// contain every `label="value"` fragment in `must_contain` (-1 if none).
double MetricValue(const std::string& exposition, const std::string& name,
                   const std::vector<std::string>& must_contain);

}  // namespace attention::testing

#endif  // ATTENTION_TESTS_SERVER_TEST_UTIL_H_
