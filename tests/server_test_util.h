// File: tests/server_test_util.h
//
// Helpers for tests that talk to a server: request building from core
// tensors, response decoding, a free loopback port, and a plain HTTP GET.
#ifndef ATTENTION_TESTS_SERVER_TEST_UTIL_H_
#define ATTENTION_TESTS_SERVER_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "attention/v1/attention.pb.h"
#include "core/tensor.h"

namespace attention::testing {

// Sets `out` to `t` (dtype, shape, bytes).
void ToProto(const Tensor& t, v1::Tensor* out);

// A copy of `t` as float32 (any float dtype).
Tensor FromProto(const v1::Tensor& t);

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort();

// The body of GET http://host:port/path ("" on failure).
std::string HttpGet(int port, const std::string& path, const std::string& host = "127.0.0.1");

// The value of the first sample line `name{...labels...} value` whose labels
// contain every `label="value"` fragment in `must_contain` (-1 if none).
double MetricValue(const std::string& exposition, const std::string& name,
                   const std::vector<std::string>& must_contain);

// How a ServerProcess's child is started, beyond its arguments.
struct ServerProcessOptions {
  // Its standard error goes to this file (truncated) instead of the test's.
  std::string stderr_path;
  // Set: its RLIMIT_NOFILE, soft and hard (the child cannot raise it).
  int max_open_files = 0;
};

// attention-server as a child process on free loopback ports.
class ServerProcess {
 public:
  // Starts `binary` with --host=`host` (a loopback address), --port=`port`
  // (0: a free one), a free --metrics_port and --http_port, and `extra_args`; waits (bounded,
  // 30 s) for health SERVING. Check ok().
  ServerProcess(const std::string& binary, const std::vector<std::string>& extra_args,
                const std::string& host = "127.0.0.1", int port = 0,
                const ServerProcessOptions& options = {});
  // Kills the process if it is still running.
  ~ServerProcess();

  bool ok() const { return ready_; }
  int pid() const { return pid_; }
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  int http_port() const { return http_port_; }
  const std::string& host() const { return host_; }
  std::string target() const { return host_ + ":" + std::to_string(port_); }
  // Sends SIGTERM and waits; returns the exit code (-1 if it did not exit).
  int Stop();
  // Sends SIGTERM without waiting.
  void Terminate();
  // Sends SIGKILL and waits.
  void Kill();
  // Waits for exit; returns the exit code (-1 if killed by a signal).
  int Wait();

 private:
  int pid_ = -1;
  std::string host_;
  int port_ = 0;
  int metrics_port_ = 0;
  int http_port_ = 0;
  bool ready_ = false;
};

// Field `field` ("VmRSS:", "VmHWM:") of /proc/<pid>/status, in bytes; -1
// when the process or the field is not there.
int64_t ProcStatusBytes(int pid, const std::string& field);

// Runs a shell command; returns its exit code and (merged) output.
int RunCommand(const std::string& command, std::string* output);

}  // namespace attention::testing

#endif  // ATTENTION_TESTS_SERVER_TEST_UTIL_H_
