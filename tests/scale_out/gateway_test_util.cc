// File: tests/scale_out/gateway_test_util.cc
#include "tests/scale_out/gateway_test_util.h"

#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace attention::gateway_test {

using testing::GatewayProcess;

std::vector<std::unique_ptr<testing::ServerProcess>> StartReplicas(int n) {
  std::vector<std::unique_ptr<testing::ServerProcess>> replicas;
  for (int i = 0; i < n; ++i) {
    replicas.push_back(std::make_unique<testing::ServerProcess>(
        ATTENTION_SERVER_BINARY, std::vector<std::string>{"--threads=1"}));
    EXPECT_TRUE(replicas.back()->ok()) << "replica " << i << " did not start";
  }
  return replicas;
}

std::vector<std::string> Targets(const std::vector<std::unique_ptr<testing::ServerProcess>>& all,
                                 const std::vector<int>& which) {
  std::vector<std::string> out;
  for (int i : which) out.push_back(all[i]->target());
  return out;
}

std::string Metrics(const testing::ServerProcess& s) {
  return testing::HttpGet(s.metrics_port(), "/metrics");
}
// Calls of `method` that `s` answered OK.
double Served(const testing::ServerProcess& s, const std::string& method) {
  return std::max(0.0, testing::MetricValue(Metrics(s), "attention_requests_total",
                                            {"code=\"OK\"", "method=\"" + method + "\""}));
}
// Calls of `method` that reached `s`, whatever their code.
double Reached(const testing::ServerProcess& s, const std::string& method) {
  std::istringstream lines(Metrics(s));
  double total = 0;
  for (std::string line; std::getline(lines, line);) {
    if (absl::StartsWith(line, "attention_requests_total{") &&
        absl::StrContains(line, "method=\"" + method + "\"")) {
      total += std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return total;
}
double LiveSessions(const testing::ServerProcess& s) {
  return testing::MetricValue(Metrics(s), "attention_sessions", {"model=\"demo\""});
}

bool Skip(Kind kind, std::string* why) {
  if (!GatewayProcess::Binary(kind).empty()) return false;
  *why = std::string(kind == Kind::kNginx ? "nginx" : "haproxy") +
         " is not installed (scripts/install_deps.sh installs it)";
  return true;
}

// Row `i` of a (T, E) float32 tensor, as a (1, E) tensor.
Tensor Row(const Tensor& x, int64_t i) {
  return Tensor::FromBytes(DType::kFloat32, {1, kE}, x.as<float>() + i * kE);
}

// The stateless causal rows of x (T, E): what every decoded row must equal.
std::vector<float> Reference(const MhaEngine& engine, const Tensor& x) {
  MhaInputs in;
  in.query = TensorView{DType::kFloat32, {1, x.dim(0), kE}, x.data()};
  in.is_causal = true;
  auto out = engine.Forward(in);
  EXPECT_TRUE(out.ok()) << out.status();
  return std::vector<float>(out->output.as<float>(), out->output.as<float>() + x.num_elements());
}

// `sessions` sequences of `tokens` tokens each (xs), decoded token by token
// by `threads` threads through `step(session, token)`, while `events` fire;
// every returned row is compared with `want` (1e-4).
Decoded Decode(int threads, const std::vector<Tensor>& xs,
               const std::vector<std::vector<float>>& want, const std::vector<Event>& events,
               const std::function<absl::StatusOr<Tensor>(int, const Tensor&)>& step) {
  const int sessions = static_cast<int>(xs.size());
  const int64_t tokens = xs[0].dim(0);
  const int64_t total = sessions * tokens;
  const int64_t slack = 2 * threads;  // Appends that may run past an event's mark.
  absl::Mutex mu;
  int64_t done = 0;
  size_t fired = 0;
  auto mark = [&](size_t i) { return static_cast<int64_t>(events[i].at * total); };
  Decoded result;
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      for (int64_t i = 0; i < tokens; ++i) {
        for (int s = w; s < sessions; s += threads) {
          {
            absl::MutexLock lock(&mu);
            auto may_go = [&]() { return fired == events.size() || done < mark(fired) + slack; };
            mu.Await(absl::Condition(&may_go));
          }
          absl::StatusOr<Tensor> row = step(s, Row(xs[s], i));
          absl::MutexLock lock(&mu);
          ++done;
          if (!row.ok()) {
            if (result.errors++ == 0) result.first_error = row.status().ToString();
            continue;
          }
          for (int64_t j = 0; j < kE; ++j) {
            if (std::abs(row->as<float>()[j] - want[s][i * kE + j]) > 1e-4) {
              ++result.wrong_rows;
              break;
            }
          }
        }
      }
    });
  }
  for (size_t e = 0; e < events.size(); ++e) {
    {
      absl::MutexLock lock(&mu);
      auto reached = [&]() { return done >= mark(e); };
      mu.Await(absl::Condition(&reached));
    }
    events[e].run();
    absl::MutexLock lock(&mu);
    ++fired;
  }
  for (auto& t : workers) t.join();
  return result;
}

}  // namespace attention::gateway_test
