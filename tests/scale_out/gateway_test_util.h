// File: tests/scale_out/gateway_test_util.h
//
// What the gateway tests share (gateway_test, gateway_each_test): replicas
// of attention-server as processes, their metrics, the skip rule when a
// gateway is not installed, the stateless reference rows, and Decode, which
// drives sequences token by token from several threads while events (a
// replica killed, the gateway reloaded) fire at set points. Test-only;
// thread-compatible (Decode synchronises its own threads).
#ifndef ATTENTION_TESTS_SCALE_OUT_GATEWAY_TEST_UTIL_H_
#define ATTENTION_TESTS_SCALE_OUT_GATEWAY_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/mha_engine.h"
#include "tests/fixture/server_test_util.h"
#include "tests/scale_out/gateway_process.h"

namespace attention::gateway_test {

using Kind = testing::GatewayProcess::Kind;

constexpr int64_t kE = 256;  // The demo model every replica serves.

// `n` replicas (--threads=1 each); a replica that does not start fails the test.
std::vector<std::unique_ptr<testing::ServerProcess>> StartReplicas(int n);
// The targets of replicas `which`.
std::vector<std::string> Targets(const std::vector<std::unique_ptr<testing::ServerProcess>>& all,
                                 const std::vector<int>& which);
std::string Metrics(const testing::ServerProcess& s);
// Calls of `method` that `s` answered OK.
double Served(const testing::ServerProcess& s, const std::string& method);
// Calls of `method` that reached `s`, whatever their code.
double Reached(const testing::ServerProcess& s, const std::string& method);
double LiveSessions(const testing::ServerProcess& s);
// True (with `why`) when the gateway `kind` is not installed.
bool Skip(Kind kind, std::string* why);
// Row `i` of a (T, E) float32 tensor, as a (1, E) tensor.
Tensor Row(const Tensor& x, int64_t i);
// The stateless causal rows of x (T, E): what every decoded row must equal.
std::vector<float> Reference(const MhaEngine& engine, const Tensor& x);

// Something done to the replicas or the gateway once `at` (a fraction) of
// the appends are done, with calls in flight; the decoders wait for it
// before going much further.
struct Event {
  double at;
  std::function<void()> run;
};

// What the callers saw.
struct Decoded {
  int64_t errors = 0;
  int64_t wrong_rows = 0;
  std::string first_error;
};

// `sessions` sequences of `tokens` tokens each (xs), decoded token by token
// by `threads` threads through `step(session, token)`, while `events` fire;
// every returned row is compared with `want` (1e-4).
Decoded Decode(int threads, const std::vector<Tensor>& xs,
               const std::vector<std::vector<float>>& want, const std::vector<Event>& events,
               const std::function<absl::StatusOr<Tensor>(int, const Tensor&)>& step);

}  // namespace attention::gateway_test

#endif  // ATTENTION_TESTS_SCALE_OUT_GATEWAY_TEST_UTIL_H_
