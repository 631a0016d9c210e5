#include "client/cli/session_commands.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/cli/client_util.h"
#include "client/cli/progress_line.h"
#include "client/cli/session_client.h"
#include "nlohmann/json.hpp"
#include "proto/codec/tensor_codec.h"

namespace attention::client {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "attention-client: %s\n", message.c_str());
  return 1;
}

// Rows [from, from + count) of a (T, E) float32 tensor.
Tensor Rows(const Tensor& t, int64_t from, int64_t count) {
  const int64_t e = t.dim(1);
  return Tensor::FromBytes(DType::kFloat32, {count, e}, t.as<float>() + from * e);
}

v1::AppendRequest AppendOf(const std::string& id, const Tensor& tokens) {
  v1::AppendRequest request;
  request.set_session_id(id);
  wire::EncodeTensor(tokens, request.mutable_tokens());
  return request;
}

std::string Latencies(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return absl::StrCat("p50 ", Percentile(ms, 0.5), " ms, p90 ", Percentile(ms, 0.9), " ms, p99 ",
                      Percentile(ms, 0.99), " ms, max ", ms.empty() ? 0 : ms.back(), " ms");
}

// "CODE: message", with CallAdvice's hint when it has one.
std::string WithHint(const absl::Status& status, const SessionCommandOptions& o) {
  const std::string hint =
      CallAdvice::For(static_cast<int>(status.code()), std::string(status.message()),
                      CallOf(o.target, o.deadline_ms));
  return absl::StrCat(status.ToString(), hint.empty() ? "" : absl::StrCat("\n  hint: ", hint));
}

}  // namespace

std::string PrefillDeadlineMessage(int64_t sessions, int64_t context, int64_t deadline_ms) {
  return absl::StrCat("prefilling ", sessions, " x ", context,
                      " tokens took longer than --deadline_ms=", deadline_ms,
                      "; raise it (each append of the prefill has that long, queued behind the "
                      "other sessions'), or prefill less (--sessions, --context)");
}

int RunSessionCheck(const SessionCommandOptions& o) {
  if (o.tokens < 1 || o.chunk < 1) return Fail("--tokens and --chunk must be >= 1");
  auto attention = v1::AttentionService::NewStub(MakeChannel(o.target, o.lb_policy));
  auto model = FetchModel(attention.get(), o.model, o.deadline_ms, o.target, "session");
  if (!model.ok()) return Fail(std::string(model.status().message()));
  std::mt19937 rng(o.seed);
  const Tensor x = RandomNormal({o.tokens, model->embed_dim()}, rng);

  SessionClient client(o.target, o.lb_policy, o.deadline_ms);
  v1::CreateSessionRequest create;
  create.set_model(model->name());
  create.set_kind(v1::SESSION_KIND_SELF);
  auto info = client.Create(create);
  if (!info.ok()) return Fail(absl::StrCat("CreateSession: ", WithHint(info.status(), o)));
  const std::string id = info->session_id();
  std::vector<float> outputs;
  std::vector<double> step_ms;
  for (int64_t at = 0; at < o.tokens; at += o.chunk) {
    const int64_t t = std::min(o.chunk, o.tokens - at);
    v1::AppendRequest request = AppendOf(id, Rows(x, at, t));
    request.set_output_dtype(v1::DATA_TYPE_FLOAT32);
    const absl::Time start = absl::Now();
    auto response = client.Append(request);
    step_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    if (!response.ok()) return Fail(absl::StrCat("Append: ", WithHint(response.status(), o)));
    if (response->length() != at + t) {
      return Fail(
          absl::StrCat("Append: session length ", response->length(), ", expected ", at + t));
    }
    auto out = wire::DecodeTensorCopy(response->output(), "output");
    if (!out.ok()) return Fail(std::string(out.status().message()));
    outputs.insert(outputs.end(), out->as<float>(), out->as<float>() + out->num_elements());
  }
  (void)client.Close(id);

  // The reference: one stateless Infer over the whole sequence.
  v1::InferRequest infer;
  infer.set_model(model->name());
  wire::EncodeTensor(x, infer.mutable_query());
  infer.set_is_causal(true);
  infer.set_output_dtype(v1::DATA_TYPE_FLOAT32);
  grpc::ClientContext context;
  SetDeadline(&context, o.deadline_ms);
  v1::InferResponse whole;
  const grpc::Status status = attention->Infer(&context, infer, &whole);
  if (!status.ok()) return Fail(DescribeFailure("Infer", status, o.target, o.deadline_ms));
  auto want = wire::DecodeTensorCopy(whole.output(), "output");
  if (!want.ok() || want->num_elements() != static_cast<int64_t>(outputs.size())) {
    return Fail("Infer: unexpected output");
  }
  // float32 layers agree to float rounding; bfloat16 ones to bfloat16's.
  const bool bf16 = model->compute_dtype() == v1::DATA_TYPE_BFLOAT16;
  const double atol = bf16 ? 5e-2 : 1e-4, rtol = bf16 ? 5e-2 : 1e-4;
  double worst = 0;
  int64_t bad = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const double d = std::abs(outputs[i] - want->as<float>()[i]);
    worst = std::max(worst, d);
    if (!(d <= atol + rtol * std::abs(want->as<float>()[i]))) ++bad;
  }
  std::printf("session %s (model %s): %lld tokens in %zu appends of up to %lld\n", id.c_str(),
              model->name().c_str(), static_cast<long long>(o.tokens), step_ms.size(),
              static_cast<long long>(o.chunk));
  std::printf("append latency: %s\n", Latencies(step_ms).c_str());
  std::printf(
      "vs one stateless Infer with is_causal: max |diff| %.3g, %lld of %zu values over "
      "%.0e + %.0e x |expected|: %s\n",
      worst, static_cast<long long>(bad), outputs.size(), atol, rtol,
      bad == 0 ? "MATCH" : "MISMATCH");
  return bad == 0 ? 0 : 1;
}

int RunDecodeLoad(const SessionCommandOptions& o) {
  if (o.sessions < 1 || o.steps < 1 || o.context < 0) {
    return Fail(absl::StrCat("--sessions and --steps must be >= 1, --context >= 0; got --sessions=",
                             o.sessions, " --steps=", o.steps, " --context=", o.context));
  }
  auto attention = v1::AttentionService::NewStub(MakeChannel(o.target, o.lb_policy));
  auto model = FetchModel(attention.get(), o.model, o.deadline_ms, o.target, "load");
  if (!model.ok()) return Fail(std::string(model.status().message()));
  const int64_t e = model->embed_dim();
  const int64_t chunk =
      std::max<int64_t>(1, std::min<int64_t>(512, model->batching().max_batch_tokens()));
  SessionClient client(o.target, o.lb_policy, o.deadline_ms);
  absl::Barrier* prefilled = new absl::Barrier(static_cast<int>(o.sessions) + 1);
  absl::Barrier* finished = new absl::Barrier(static_cast<int>(o.sessions) + 1);
  std::vector<std::vector<double>> step_ms(o.sessions);
  std::vector<double> batch_sum(o.sessions, 0);
  std::atomic<int64_t> errors{0};
  std::atomic<int64_t> resent{0};   // Appends sent again after UNAVAILABLE.
  std::atomic<int64_t> unready{0};  // Sessions not created or not prefilled: they skip the steps.
  absl::Mutex error_mu;
  std::string first_error;
  auto failed = [&](const absl::Status& status, bool prefill) {
    ++errors;
    absl::MutexLock lock(&error_mu);
    if (!first_error.empty()) return;
    first_error = prefill && status.code() == absl::StatusCode::kDeadlineExceeded
                      ? absl::StrCat(status.ToString(), "\n  hint: ",
                                     PrefillDeadlineMessage(o.sessions, o.context, o.deadline_ms))
                      : WithHint(status, o);
  };
  std::fprintf(stderr, "decode load: creating %lld sessions%s\n",
               static_cast<long long>(o.sessions),
               o.context > 0 ? absl::StrCat(", each prefilling ", o.context, " tokens (",
                                            o.sessions, " x ", o.context, " tokens)")
                                   .c_str()
                             : "");
  ProgressLine prefill_progress(stderr, "prefilled ", o.sessions, " sessions");
  // The steps' progress counts only the sessions that are ready: made once
  // the prefill is over, before any session steps (`stepping`).
  std::optional<ProgressLine> step_progress;
  absl::Notification stepping;
  std::vector<std::thread> threads;
  for (int64_t s = 0; s < o.sessions; ++s) {
    threads.emplace_back([&, s] {
      std::mt19937 rng(o.seed + static_cast<uint32_t>(s));
      const Tensor x = RandomNormal({o.context + o.steps, e}, rng);
      v1::CreateSessionRequest create;
      create.set_model(model->name());
      create.set_kind(v1::SESSION_KIND_SELF);
      auto info = client.Create(create);
      std::string id = info.ok() ? info->session_id() : "";
      // Every append carries the session's length (expected_length), so one
      // whose call was cut (UNAVAILABLE) is sent again safely; one applied
      // whose answer was lost (DATA_LOSS) still counts as done.
      auto append = [&](int64_t at, int64_t count) {
        v1::AppendRequest request = AppendOf(id, Rows(x, at, count));
        request.set_expected_length(at);
        int sent_again = 0;
        auto response = client.AppendResending(request, &sent_again);
        resent += sent_again;
        return response;
      };
      bool ready = info.ok();  // Created and prefilled: it steps.
      for (int64_t at = 0; ready && at < o.context; at += chunk) {
        auto prefill = append(at, std::min(chunk, o.context - at));
        if (!prefill.ok() && prefill.status().code() != absl::StatusCode::kDataLoss) {
          failed(prefill.status(), true);
          ready = false;
        }
      }
      if (!info.ok()) failed(info.status(), false);
      if (ready) {
        prefill_progress.Done();
      } else {
        ++unready;
      }
      if (prefilled->Block()) delete prefilled;
      if (ready) stepping.WaitForNotification();
      for (int64_t i = 0; ready && i < o.steps; ++i) {
        const absl::Time start = absl::Now();
        auto response = append(o.context + i, 1);
        if (!response.ok() && response.status().code() != absl::StatusCode::kDataLoss) {
          failed(response.status(), false);
          break;
        }
        step_progress->Done();
        if (!response.ok()) continue;  // Applied; its answer was lost.
        step_ms[s].push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
        batch_sum[s] += response->batch_requests();
      }
      if (finished->Block()) delete finished;
      if (info.ok()) (void)client.Close(id);
    });
  }
  if (prefilled->Block()) delete prefilled;
  if (unready.load() > 0) {
    absl::MutexLock lock(&error_mu);
    std::fprintf(stderr,
                 "%lld of %lld sessions failed to be created or prefilled; first error: %s\n",
                 static_cast<long long>(unready.load()), static_cast<long long>(o.sessions),
                 first_error.c_str());
  }
  const int64_t ready_sessions = o.sessions - unready.load();
  if (ready_sessions == 0) {  // Nothing to step: the prefill's error is the answer.
    stepping.Notify();
    if (finished->Block()) delete finished;
    for (auto& t : threads) t.join();
    std::fprintf(stderr, "decode load: no session is ready, so no step ran\n");
    return 1;
  }
  std::fprintf(stderr, "decode load: %lld sessions stepping %lld tokens each\n",
               static_cast<long long>(ready_sessions), static_cast<long long>(o.steps));
  step_progress.emplace(stderr, "decoded ", ready_sessions * o.steps, " tokens");
  stepping.Notify();
  const absl::Time start = absl::Now();
  if (finished->Block()) delete finished;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  for (auto& t : threads) t.join();
  if (!first_error.empty() && unready.load() == 0) {  // Else reported after the prefill.
    std::fprintf(stderr, "first error: %s\n", first_error.c_str());
  }
  std::vector<double> all;
  double batches = 0;
  for (int64_t s = 0; s < o.sessions; ++s) {
    all.insert(all.end(), step_ms[s].begin(), step_ms[s].end());
    batches += batch_sum[s];
  }
  std::sort(all.begin(), all.end());
  const double tokens_per_s = static_cast<double>(all.size()) / seconds;
  std::printf("decode load: %lld sessions x %lld steps after a %lld-token context (model %s)%s\n",
              static_cast<long long>(ready_sessions), static_cast<long long>(o.steps),
              static_cast<long long>(o.context), model->name().c_str(),
              ready_sessions < o.sessions ? absl::StrCat("; ", o.sessions - ready_sessions, " of ",
                                                         o.sessions, " sessions failed to start")
                                                .c_str()
                                          : "");
  std::printf("tokens/s %.1f, step latency %s, mean batch %.2f, errors %lld, resent %lld\n",
              tokens_per_s, Latencies(all).c_str(), all.empty() ? 0.0 : batches / all.size(),
              static_cast<long long>(errors.load()), static_cast<long long>(resent.load()));
  if (!o.json.empty()) {
    nlohmann::json j = {{"sessions", o.sessions},
                        {"ready_sessions", ready_sessions},
                        {"steps", o.steps},
                        {"context", o.context},
                        {"tokens_per_s", tokens_per_s},
                        {"p50_ms", Percentile(all, 0.5)},
                        {"p90_ms", Percentile(all, 0.9)},
                        {"p99_ms", Percentile(all, 0.99)},
                        {"errors", errors.load()},
                        {"resent", resent.load()},
                        {"mean_batch", all.empty() ? 0.0 : batches / all.size()}};
    std::ofstream(o.json) << j.dump(1) << "\n";
  }
  return errors.load() == 0 ? 0 : 1;
}

}  // namespace attention::client
