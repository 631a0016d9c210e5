// Open Inference Protocol requests (inference.ModelInferRequest) through
// the server's own path, as InferenceProtocol::Submit takes it:
// RequestPath::Admissible (model lookup), DecodeModelInfer, then
// for a stateless request RequestPath::Finalize (the engine's
// Validate and the response-size estimate) and Submit (admission and the
// model's batcher), for a sequence step SequenceSessions::Submit (sessions,
// PrepareStep, admission, the session queue); the outcome encoded by
// EncodeModelInfer. Up to five requests per input are all submitted while
// the batchers are held (the repository's compute mutex), so that steps of
// one sequence are queued behind each other as a pipelining client's are.
//
// Not reachable from here (inside InferenceProtocol): the check of
// model_version's value (Model; its length is checked with the same
// CheckIdentifier) and the `timeout` parameter of stateless requests
// (Prepare); the response's labels (model name, version, id) are set as its
// Label does. The servers: oip_fuzz_env.h.
//
// Checked: no crash; every answer is OK or an expected refusal
// (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, or
// DEADLINE_EXCEEDED for a request with a `timeout`) with a message; a
// computed stateless response is no larger than its admitted estimate; a
// sequence step that changed its session was answered OK (issue 21 item 2);
// no session is left by a refused sequence_start (item 3c); no error message
// repeats a long identifier whole (item 3c); what was allocated stays within
// what was admitted (item 3, see MemoryCheck); every admitted byte is
// released.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/memory_meter.h"
#include "core/status_macros.h"
#include "grpcpp/server_context.h"
#include "server/frontends/grpc/grpc_call.h"
#include "server/frontends/protocol/oip_codec.h"
#include "server/frontends/protocol/sequence_sessions.h"
#include "server/requests/identifiers.h"
#include "server/requests/request_path.h"
#include "server/sessions/session_batch_runner.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_path.h"
#include "tests/fuzz/fuzz_entries.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/oip_fuzz_env.h"
#include "tests/fuzz/oip_request_gen.h"

namespace attention::fuzz {
namespace {

using server::RequestOutcome;
using server::RequestPath;

constexpr absl::Duration kAnswerTimeout = absl::Seconds(20);
// Identifiers longer than this are not repeated whole in error messages
// (issue 21 item 3c: errors echoed unbounded input).
constexpr size_t kMaxEchoedBytes = 1024;

absl::Status Bug(absl::string_view what) {
  return absl::InternalError(absl::StrCat("fuzz invariant: ", what));
}

// What became of one request.
struct Answer {
  absl::Status status;     // As the client would see it.
  std::string echo;        // An identifier it sent that no message may repeat whole.
  bool timeout = false;    // It had a `timeout` parameter.
  bool start = false;      // It had sequence_start.
  absl::Status invariant;  // A broken invariant found while answering it.
};

// The answers of one input's requests, filled by the batcher threads.
class Answers {
 public:
  explicit Answers(size_t n) : answers_(n) {}
  void Expect() {
    absl::MutexLock lock(&mu_);
    ++pending_;
  }
  void Set(size_t i, Answer a) {
    absl::MutexLock lock(&mu_);
    answers_[i] = std::move(a);
  }
  void Done(size_t i, Answer a) {
    absl::MutexLock lock(&mu_);
    answers_[i] = std::move(a);
    --pending_;
  }
  bool WaitAll() {
    absl::MutexLock lock(&mu_);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&all), kAnswerTimeout);
  }
  std::vector<Answer> Take() {
    absl::MutexLock lock(&mu_);
    return std::move(answers_);
  }

 private:
  absl::Mutex mu_;
  std::vector<Answer> answers_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
};

// The per-input session state: a new manager each input, so that no input
// sees another's sessions (and each is reproducible alone).
struct Sessions {
  std::unique_ptr<server::SessionManager> manager;
  std::unique_ptr<server::SessionPath> service;
  std::unique_ptr<server::SequenceSessions> sequences;
};

// The request's model name or string sequence_id when longer than
// kMaxEchoedBytes (else empty): a message may quote only part of it.
std::string LongIdentifier(const inference::ModelInferRequest& request) {
  if (request.model_name().size() > kMaxEchoedBytes) return request.model_name();
  const auto it = request.parameters().find("sequence_id");
  if (it != request.parameters().end() && it->second.string_param().size() > kMaxEchoedBytes) {
    return it->second.string_param();
  }
  return "";
}

// Runs request `i` as ModelInfer does, up to queuing it; its answer comes
// to `answers` (at once when refused before queuing). Returns the bytes of
// the request message admitted with it (0 when refused before queuing).
int64_t Submit(Environment& env, Sessions& sessions, const inference::ModelInferRequest& request,
               grpc::CallbackServerContext* context, size_t i, Answers* answers) {
  RequestPath& service = *env.service;
  const server::CallRef call = server::CallOf(context, server::Method::kModelInfer);
  Answer refused;
  refused.echo = LongIdentifier(request);
  // InferenceServiceImpl::Model (private): the version's length, the model;
  // its check of the version's value is not reachable from here.
  const absl::Status version = server::CheckIdentifier(request.model_version(), "model_version");
  const absl::StatusOr<const server::ServedModel*> model =
      version.ok() ? service.Admissible(*call, request.model_name())
                   : absl::StatusOr<const server::ServedModel*>(version);
  absl::StatusOr<server::OipRequest> decoded =
      model.ok() ? server::DecodeModelInfer(request) : model.status();
  if (decoded.ok()) {
    const absl::Status id = server::CheckIdentifier(request.id(), "id");
    if (!id.ok()) decoded = id;
  }
  if (!decoded.ok()) {
    refused.status = decoded.status();
    answers->Set(i, refused);
    return 0;
  }
  const server::ServedModel* served = *model;
  refused.timeout = decoded->timeout.has_value();
  refused.start = decoded->sequence_start;
  const std::vector<server::OipOutput> outputs = decoded->outputs;
  const bool sequence = decoded->sequence_id.has_value();
  const bool timeout = refused.timeout, start = refused.start;
  const MhaSpec& spec = served->model->spec();
  // PyTorch refuses self-attention unless kdim == vdim == embed_dim.
  const bool self_possible = spec.kdim == spec.embed_dim && spec.vdim == spec.embed_dim;
  const int64_t max_bytes = service.options().max_response_bytes;
  auto label = [&request, served](inference::ModelInferResponse* response) {
    response->set_model_name(served->name);
    response->set_model_version("1");
    response->set_id(server::Echoed(request.id()));
  };
  // The answer `outcome` makes: its status, then the encoding's into
  // `response` (labelled).
  auto answer_of = [label, outputs, max_bytes, timeout, echo = refused.echo](
                       RequestOutcome& outcome, inference::ModelInferResponse* response) {
    Answer a;
    a.timeout = timeout;
    a.echo = echo;
    label(response);
    a.status = outcome.status;
    if (a.status.ok()) a.status = EncodeModelInfer(outcome, outputs, max_bytes, response);
    return a;
  };
  absl::Status status;
  answers->Expect();
  if (sequence) {
    status = sessions.sequences->Submit(
        *call, request, *std::move(decoded), served, nullptr, nullptr,
        [answers, i, start, answer_of, self_possible, served](RequestOutcome outcome) {
          inference::ModelInferResponse response;
          Answer a = answer_of(outcome, &response);
          a.start = start;
          if (outcome.status.ok() && !a.status.ok()) {
            a.invariant =
                Bug(absl::StrCat("a sequence step was applied (session length ",
                                 outcome.session_length, ") and answered ", a.status.ToString()));
          }
          if (outcome.status.ok() && !self_possible) {
            const MhaSpec& s = served->model->spec();
            a.invariant = Bug(absl::StrCat("a sequence step on model '", served->name,
                                           "' (embed_dim ", s.embed_dim, ", kdim ", s.kdim,
                                           ", vdim ", s.vdim, ") was computed as self-attention"));
          }
          answers->Done(i, std::move(a));
        });
  } else {
    RequestPath::Prepared prepared;
    prepared.model = served;
    auto pending = std::make_unique<server::PendingRequest>();
    pending->inputs = std::move(decoded->inputs);
    status = service.Finalize(std::move(pending), request.id().size(), nullptr, *call, &prepared);
    const int64_t estimate = prepared.response_bytes;
    if (status.ok()) {
      status = service.Submit(
          prepared, static_cast<int64_t>(request.ByteSizeLong()),
          [answers, i, answer_of, estimate](RequestOutcome outcome) {
            inference::ModelInferResponse response;
            Answer a = answer_of(outcome, &response);
            const int64_t bytes = static_cast<int64_t>(response.ByteSizeLong());
            if (outcome.status.ok() && (!a.status.ok() || bytes > estimate)) {
              a.invariant = Bug(absl::StrCat("a computed response of ", bytes,
                                             " bytes, estimated and admitted as ", estimate,
                                             ", was answered ", a.status.ToString()));
            }
            answers->Done(i, std::move(a));
          });
    }
  }
  if (!status.ok()) {
    refused.status = status;
    answers->Done(i, refused);
    return 0;
  }
  return static_cast<int64_t>(request.ByteSizeLong());
}

// What admission held (the in-flight budget's peak, less the request
// messages whose bytes it holds but the meter does not count, plus the
// largest batch's working-memory estimate) against what the engines and
// result buffers allocated (MemoryMeter's peak), as
// tests/memory/accounting_test.cc measures one RPC. The request
// messages are subtracted only when the peak was with every request held
// (right after they were all queued), the one moment their sum is known to
// be part of it.
class MemoryCheck {
 public:
  explicit MemoryCheck(Environment& env) : env_(env) {
    for (const server::ServedModel* m : env_.repository->models()) m->batcher->ResetPeakWorking();
    budget_before_ = env_.service->budget().used();
    env_.service->budget().ResetPeak();
    meter_before_ = MemoryMeter::current();
    MemoryMeter::ResetPeak();
  }
  // Every request is queued (none computed yet); `request_bytes` of their
  // messages are held.
  void Queued(int64_t request_bytes) {
    queued_ = env_.service->budget().used();
    request_bytes_ = request_bytes;
  }
  absl::Status Check() const {
    const int64_t allocated = MemoryMeter::peak() - meter_before_;
    int64_t working = 0;
    for (const server::ServedModel* m : env_.repository->models()) {
      working = std::max(working, m->batcher->peak_working_bytes());
    }
    const int64_t peak = env_.service->budget().peak();
    const int64_t messages = peak == queued_ ? request_bytes_ : 0;
    const int64_t admitted = peak - budget_before_ - messages + working;
    if (allocated <= admitted) return absl::OkStatus();
    return Bug(absl::StrCat("allocated ", allocated, " bytes, admitted ", admitted,
                            " (in-flight peak ", peak - budget_before_, " less request messages ",
                            messages, ", working estimate ", working, ")"));
  }

 private:
  Environment& env_;
  int64_t budget_before_ = 0, meter_before_ = 0, queued_ = -1, request_bytes_ = 0;
};

}  // namespace

absl::Status FuzzOneOipRequest(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  const OipInput input = ReadOipRequests(in, Env(false).shapes);
  Environment& env = Env(input.roomy);
  const std::vector<OipInputRequest>& requests = input.requests;
  server::SessionOptions options;
  options.memory_bytes = 4 << 20;
  options.evict_grace = absl::ZeroDuration();  // Eviction by order alone, not by time.
  Sessions sessions;
  sessions.manager =
      std::make_unique<server::SessionManager>(env.repository.get(), env.metrics.get(), options);
  server::InstallSessionRunners(*sessions.manager, *env.repository);
  sessions.service = std::make_unique<server::SessionPath>(env.service.get());
  sessions.service->SetManager(sessions.manager.get());
  sessions.sequences = std::make_unique<server::SequenceSessions>(sessions.service.get());
  std::vector<std::unique_ptr<grpc::CallbackServerContext>> contexts;
  Answers answers(requests.size());
  MemoryCheck memory(env);
  {
    // Every request is prepared and queued before any computes.
    absl::MutexLock hold(env.repository->compute_mutex());
    int64_t request_bytes = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (!requests[i].parsed) {  // gRPC refuses it before the service sees it.
        Answer a;
        a.status = absl::InvalidArgumentError("not a ModelInferRequest");
        answers.Set(i, std::move(a));
        continue;
      }
      contexts.push_back(std::make_unique<grpc::CallbackServerContext>());
      request_bytes +=
          Submit(env, sessions, *requests[i].request, contexts.back().get(), i, &answers);
    }
    memory.Queued(request_bytes);
  }
  if (!answers.WaitAll()) abort();  // A request never answered: let libFuzzer keep it.
  const int64_t live = sessions.manager->live_sessions();
  sessions.sequences.reset();
  sessions.service.reset();
  sessions.manager.reset();
  absl::Status verdict = absl::InvalidArgumentError("no request");
  bool any_ok = false;
  int64_t started = 0;
  for (const Answer& a : answers.Take()) {
    if (!a.invariant.ok()) return a.invariant;
    const absl::Status& s = a.status;
    if (s.ok()) {
      any_ok = true;
      started += a.start;
      continue;
    }
    if (s.message().empty()) return Bug(absl::StrCat(s.ToString(), ": no message"));
    if (!a.echo.empty() && s.message().find(a.echo) != absl::string_view::npos) {
      return Bug(absl::StrCat("an error message of ", s.message().size(), " bytes repeats a whole ",
                              a.echo.size(), "-byte identifier: ", s.message().substr(0, 120),
                              "..."));
    }
    if (s.code() == absl::StatusCode::kDeadlineExceeded && a.timeout) continue;
    if (IsFuzzBug(s)) return s;
    verdict = s;
  }
  // A sequence's session exists only once a start succeeded (issue 21 item 3c).
  if (live > started) {
    return Bug(absl::StrCat(live, " sessions live after ", started,
                            " successful sequence_start(s): a refused start left its session"));
  }
  RETURN_IF_ERROR(memory.Check());
  if (env.service->inflight_bytes() != 0) {
    return Bug(absl::StrCat(env.service->inflight_bytes(),
                            " in-flight bytes still admitted after every answer"));
  }
  return any_ok ? absl::OkStatus() : verdict;
}

}  // namespace attention::fuzz
