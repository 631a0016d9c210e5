#include "client/cli/load_generator.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli/client_util.h"
#include "client/cli/oip_request.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "proto/codec/tensor_codec.h"

namespace attention::client {
namespace {

struct Sample {
  double latency_ms;
  int64_t tokens, queue_us, compute_us, batch_requests;
};

// What one worker saw.
struct WorkerStats {
  std::vector<Sample> samples;
  std::map<std::string, int64_t> errors;
  int64_t reopens = 0;  // Streams opened again after the server closed one.
};

struct PooledRequest {
  v1::InferRequest request;
  inference::ModelInferRequest oip;  // The same request, --protocol kserve.
  std::vector<int64_t> output_shape;
  int64_t tokens;
};

std::vector<PooledRequest> BuildPool(const LoadOptions& o, const v1::ModelInfo& model) {
  std::mt19937 rng(o.seed);
  std::vector<PooledRequest> pool;
  for (int i = 0; i < 32; ++i) {
    std::uniform_int_distribution<int64_t> l_dist(o.seq_len.min, o.seq_len.max);
    std::uniform_int_distribution<int64_t> s_dist(o.kv_seq_len.min, o.kv_seq_len.max);
    const int64_t l = l_dist(rng);
    const bool cross = o.kv_seq_len.max > 0 || model.kdim() != model.embed_dim() ||
                       model.vdim() != model.embed_dim();
    const int64_t s = o.kv_seq_len.max > 0 ? s_dist(rng) : l;
    PooledRequest p;
    p.request.set_model(o.model);
    p.request.set_request_id(absl::StrCat("load-", i));
    wire::EncodeTensor(RandomNormal({o.batch, l, model.embed_dim()}, rng),
                       p.request.mutable_query());
    if (cross) {
      wire::EncodeTensor(RandomNormal({o.batch, s, model.kdim()}, rng), p.request.mutable_key());
      wire::EncodeTensor(RandomNormal({o.batch, s, model.vdim()}, rng), p.request.mutable_value());
    }
    const int64_t padded = static_cast<int64_t>(o.pad_share * static_cast<double>(s));
    if (padded > 0) {
      Tensor mask(DType::kBool, {o.batch, s});
      for (int64_t n = 0; n < o.batch; ++n) {
        for (int64_t j = s - padded; j < s; ++j) mask.mutable_as<uint8_t>()[n * s + j] = 1;
      }
      wire::EncodeTensor(mask, p.request.mutable_key_padding_mask());
    }
    p.request.set_is_causal(o.is_causal);
    p.request.set_need_weights(o.need_weights);
    p.output_shape = {o.batch, l, model.embed_dim()};
    p.tokens = o.batch * l;
    if (o.protocol == "kserve") p.oip = ToModelInfer(p.request, model.name());
    pool.push_back(std::move(p));
  }
  return pool;
}

// Checks a response and records it.
void Record(const PooledRequest& p, const v1::InferResponse& response, double ms,
            WorkerStats* stats) {
  const auto& shape = response.output().shape();
  if (!std::equal(shape.begin(), shape.end(), p.output_shape.begin(), p.output_shape.end())) {
    ++stats->errors["SHAPE_MISMATCH"];
    return;
  }
  stats->samples.push_back(
      {ms, p.tokens, response.queue_us(), response.compute_us(), response.batch_requests()});
}

void Record(const PooledRequest& p, const inference::ModelInferResponse& response, double ms,
            WorkerStats* stats) {
  if (response.outputs_size() < 1 || response.raw_output_contents_size() < 1) {
    ++stats->errors["SHAPE_MISMATCH"];
    return;
  }
  const auto& shape = response.outputs(0).shape();
  if (!std::equal(shape.begin(), shape.end(), p.output_shape.begin(), p.output_shape.end())) {
    ++stats->errors["SHAPE_MISMATCH"];
    return;
  }
  stats->samples.push_back({ms, p.tokens, OipInt(response, "queue_us"),
                            OipInt(response, "compute_us"), OipInt(response, "batch_requests")});
}

// The two protocols' requests and stream messages, for the workers' loops.
const v1::InferRequest& RequestOf(const PooledRequest& p, const v1::InferRequest*) {
  return p.request;
}
const inference::ModelInferRequest& RequestOf(const PooledRequest& p,
                                              const inference::ModelInferRequest*) {
  return p.oip;
}
// A stream response's error code, if it carries one.
std::optional<grpc::StatusCode> ErrorOf(const v1::InferResponse& r) {
  if (!r.has_error()) return std::nullopt;
  return static_cast<grpc::StatusCode>(r.error().code());
}
std::optional<grpc::StatusCode> ErrorOf(const inference::ModelStreamInferResponse& r) {
  if (r.error_message().empty()) return std::nullopt;
  return grpc::StatusCode::UNKNOWN;  // The extension carries a message only.
}
const v1::InferResponse& ResultOf(const v1::InferResponse& r) { return r; }
const inference::ModelInferResponse& ResultOf(const inference::ModelStreamInferResponse& r) {
  return r.infer_response();
}

// Hands a worker its next request: false when the level is over; else
// *start is when the request is due (now, in a closed loop; its slot in the
// schedule with --rate, slept until), the time its latency counts from, so
// that a request the workers could not send on time counts its wait (no
// coordinated omission).
using Taker = std::function<bool(absl::Time* start)>;

// One worker's unary loop: `call(context, request, response)` per request.
template <typename Request, typename Response, typename Call>
void UnaryLoop(const std::vector<PooledRequest>& pool, size_t next, int64_t deadline_ms,
               const Taker& take, std::atomic<int64_t>* done, Call call, WorkerStats* st) {
  absl::Time t0;
  while (take(&t0)) {
    const PooledRequest& p = pool[next++ % pool.size()];
    grpc::ClientContext ctx;
    SetDeadline(&ctx, deadline_ms);
    Response response;
    const grpc::Status status =
        call(&ctx, RequestOf(p, static_cast<const Request*>(nullptr)), &response);
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    status.ok() ? Record(p, response, ms, st)
                : static_cast<void>(++st->errors[CodeName(status.error_code())]);
    ++*done;
  }
}

// One worker's stream loop: one stream at a time (`open(context)`), one
// request in flight on it. A stream the server closes with UNAVAILABLE (a
// drain, a connection recycled, a finite --max_connection_age_grace_s) is
// opened again and the request in flight re-sent (attention requests have no
// side effects), up to kMaxReopens times in a row; a stream broken otherwise,
// or still failing then, is one error (its status), and the worker opens a
// new stream for its next request.
constexpr int kMaxReopens = 3;

template <typename Request, typename Response, typename Open>
void StreamLoop(const std::vector<PooledRequest>& pool, size_t next, int64_t stream_deadline_ms,
                const Taker& take, std::atomic<int64_t>* done, Open open, WorkerStats* st) {
  static constexpr absl::Duration kBackoff[kMaxReopens] = {
      absl::Milliseconds(50), absl::Milliseconds(200), absl::Milliseconds(500)};
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientReaderWriter<Request, Response>> stream;
  absl::Time t0;
  while (take(&t0)) {
    const PooledRequest& p = pool[next++ % pool.size()];
    const Request& request = RequestOf(p, static_cast<const Request*>(nullptr));
    Response response;
    ++*done;
    bool answered = false;
    grpc::Status broken;
    for (int reopen = 0; !answered && reopen <= kMaxReopens; ++reopen) {
      if (reopen > 0) {
        absl::SleepFor(kBackoff[reopen - 1]);
        ++st->reopens;
      }
      if (stream == nullptr) {
        ctx = std::make_unique<grpc::ClientContext>();
        SetDeadline(ctx.get(), stream_deadline_ms);
        stream = open(ctx.get());
      }
      answered = stream->Write(request) && stream->Read(&response);
      if (answered) break;
      broken = stream->Finish();
      stream.reset();
      if (broken.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    }
    if (!answered) {
      ++st->errors[broken.ok() ? "STREAM_BROKEN" : CodeName(broken.error_code())];
      continue;
    }
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    if (const auto error = ErrorOf(response)) {
      ++st->errors[CodeName(*error)];
    } else {
      Record(p, ResultOf(response), ms, st);
    }
  }
  if (stream == nullptr) return;
  stream->WritesDone();
  const grpc::Status status = stream->Finish();
  if (!status.ok()) ++st->errors[CodeName(status.error_code())];
}

}  // namespace

int64_t LevelResult::total_errors() const {
  int64_t n = 0;
  for (const auto& [code, count] : errors) n += count;
  return n;
}

absl::StatusOr<Range> ParseRange(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  Range r;
  if (parts.size() == 1 && absl::SimpleAtoi(parts[0], &r.min)) {
    r.max = r.min;
  } else if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &r.min) ||
             !absl::SimpleAtoi(parts[1], &r.max)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not N or MIN:MAX"));
  }
  if (r.min < 0 || r.max < r.min) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a valid range"));
  }
  return r;
}

absl::StatusOr<std::vector<LevelResult>> RunLoad(const LoadOptions& o) {
  if (o.rpc != "unary" && o.rpc != "stream") {
    return absl::InvalidArgumentError(absl::StrCat("--rpc must be unary or stream, got ", o.rpc));
  }
  if (o.protocol != "attention" && o.protocol != "kserve") {
    return absl::InvalidArgumentError(
        absl::StrCat("--protocol must be attention or kserve, got ", o.protocol));
  }
  if (o.rate < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--rate must be >= 0, got ", o.rate));
  }
  if (o.seq_len.min < 1 || o.batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--seq_len=", o.seq_len.min, " --batch=", o.batch, ": both must be at least 1"));
  }
  auto channel = MakeChannel(o.target, o.lb_policy);
  auto stub = v1::AttentionService::NewStub(channel);
  auto oip = inference::GRPCInferenceService::NewStub(channel);
  auto model = FetchModel(stub.get(), o.model, o.deadline_ms, o.target, "load");
  if (!model.ok()) return model.status();
  const std::vector<PooledRequest> pool = BuildPool(o, *model);

  std::vector<LevelResult> results;
  for (int concurrency : o.concurrency) {
    if (o.on_level_start) o.on_level_start(static_cast<int>(results.size()), concurrency);
    std::vector<WorkerStats> stats(concurrency);
    std::atomic<int64_t> remaining{o.requests > 0 ? o.requests : INT64_MAX};
    std::atomic<int64_t> done{0};
    const absl::Time start = absl::Now();
    const absl::Time end = o.requests > 0 ? absl::InfiniteFuture() : start + o.duration;
    std::atomic<int64_t> scheduled{0};
    Taker take = [&](absl::Time* due) {
      if (!(absl::Now() < end && remaining.fetch_sub(1) > 0)) return false;
      if (o.rate <= 0) {
        *due = absl::Now();
        return true;
      }
      // Open loop: the k-th request of the level is due at start + k / rate.
      *due = start + absl::Seconds(static_cast<double>(scheduled.fetch_add(1)) / o.rate);
      if (*due >= end) return false;
      const absl::Time now = absl::Now();
      if (*due > now) absl::SleepFor(*due - now);
      return true;
    };
    std::vector<std::thread> workers;
    for (int w = 0; w < concurrency; ++w) {
      workers.emplace_back([&, w] {
        WorkerStats& st = stats[w];
        const size_t next = static_cast<size_t>(w) % pool.size();
        const Taker& taker = take;
        const bool kserve = o.protocol == "kserve";
        if (o.rpc == "unary") {
          if (kserve) {
            UnaryLoop<inference::ModelInferRequest, inference::ModelInferResponse>(
                pool, next, o.deadline_ms, taker, &done,
                [&](grpc::ClientContext* c, const inference::ModelInferRequest& r,
                    inference::ModelInferResponse* out) { return oip->ModelInfer(c, r, out); },
                &st);
          } else {
            UnaryLoop<v1::InferRequest, v1::InferResponse>(
                pool, next, o.deadline_ms, taker, &done,
                [&](grpc::ClientContext* c, const v1::InferRequest& r, v1::InferResponse* out) {
                  return stub->Infer(c, r, out);
                },
                &st);
          }
          return;
        }
        const int64_t stream_deadline_ms = absl::ToInt64Milliseconds(o.duration) + o.deadline_ms +
                                           (o.requests > 0 ? o.deadline_ms * o.requests : 0);
        if (kserve) {
          StreamLoop<inference::ModelInferRequest, inference::ModelStreamInferResponse>(
              pool, next, stream_deadline_ms, taker, &done,
              [&](grpc::ClientContext* c) { return oip->ModelStreamInfer(c); }, &st);
        } else {
          StreamLoop<v1::InferRequest, v1::InferResponse>(
              pool, next, stream_deadline_ms, taker, &done,
              [&](grpc::ClientContext* c) { return stub->InferStream(c); }, &st);
        }
      });
    }
    std::atomic<bool> finished{false};
    std::thread progress;
    if (o.progress) {
      progress = std::thread([&] {
        while (!finished.load()) {
          const double s = absl::ToDoubleSeconds(absl::Now() - start);
          std::fprintf(stderr, "\rconcurrency %d: %.1f s, %ld requests, %.1f req/s   ", concurrency,
                       s, static_cast<long>(done.load()),
                       s > 0 ? static_cast<double>(done.load()) / s : 0.0);
          std::this_thread::sleep_for(std::chrono::milliseconds(250));
        }
        std::fprintf(stderr, "\r%80s\r", "");
      });
    }
    for (auto& w : workers) w.join();
    finished = true;
    if (progress.joinable()) progress.join();

    LevelResult r;
    r.concurrency = concurrency;
    r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    std::vector<double> latencies, overheads;
    int64_t tokens = 0;
    double queue = 0, compute = 0, batch = 0;
    for (const WorkerStats& st : stats) {
      for (const Sample& s : st.samples) {
        latencies.push_back(s.latency_ms);
        overheads.push_back(s.latency_ms * 1000.0 - static_cast<double>(s.compute_us));
        tokens += s.tokens;
        queue += static_cast<double>(s.queue_us);
        compute += static_cast<double>(s.compute_us);
        batch += static_cast<double>(s.batch_requests);
      }
      for (const auto& [code, count] : st.errors) r.errors[code] += count;
      r.reopens += st.reopens;
    }
    std::sort(latencies.begin(), latencies.end());
    std::sort(overheads.begin(), overheads.end());
    r.overhead_p50_us = Percentile(overheads, 0.5);
    r.ok = static_cast<int64_t>(latencies.size());
    r.requests_per_s = static_cast<double>(r.ok) / r.seconds;
    r.tokens_per_s = static_cast<double>(tokens) / r.seconds;
    r.p50_ms = Percentile(latencies, 0.50);
    r.p90_ms = Percentile(latencies, 0.90);
    r.p95_ms = Percentile(latencies, 0.95);
    r.p99_ms = Percentile(latencies, 0.99);
    r.max_ms = latencies.empty() ? 0 : latencies.back();
    if (r.ok > 0) {
      r.queue_us = queue / static_cast<double>(r.ok);
      r.compute_us = compute / static_cast<double>(r.ok);
      r.batch_requests = batch / static_cast<double>(r.ok);
    }
    if (o.on_level_done) o.on_level_done(r);
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace attention::client
