#include "server/sessions/session_batch_runner.h"

#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/requests/inflight_budget.h"

namespace attention::server {
namespace {

// One admitted append's buffers: float32 results, converted afterwards unless
// the request wants float32 (then the engine writes the response bytes).
struct Admitted {
  size_t index = 0;
  SessionStep step;
  DType out_dtype = DType::kFloat32;
  std::vector<float> output, weights;
  MeterCharge charge;  // Of output and weights.
  Shape weights_shape;
};

// Checks and allocates everything the append needs before the engine runs:
// its response against max_message_bytes and the in-flight budget (sized by
// the session's length now), its cache blocks, its buffers.
absl::Status Admit(SessionManager& manager, SessionModel& model, const PendingRequest& r,
                   RequestOutcome& out, Admitted& a) {
  const SessionEngine& engine = *model.engine;
  const MhaSpec& spec = engine.spec();
  const SessionWork& work = *r.session;
  Session& session = *work.session;
  const int64_t t = work.tokens.dim(0), e = spec.embed_dim;
  SessionStep& step = a.step;
  step.cache = session.cache.get();
  step.cross = session.cross;
  step.is_causal = session.is_causal;
  step.position = session.position;
  step.tokens = work.tokens;
  step.not_key = work.not_key;
  step.need_weights = r.inputs.need_weights;
  step.average_weights = r.inputs.average_attn_weights;
  a.out_dtype = r.inputs.output_dtype.value_or(work.tokens.dtype);
  const int64_t columns = engine.WeightColumns(step);
  const int64_t response = AppendResponseBytes(spec, t, columns, a.out_dtype, step.need_weights,
                                               step.average_weights, work.id_bytes);
  if (work.max_response_bytes > 0 && response > work.max_response_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "response: would be about ", response, " bytes with the session at length ",
        step.cross ? session.position : step.cache->length(),
        ", over the server's --max_message_bytes ", work.max_response_bytes,
        "; the append was not applied (append fewer tokens or leave need_weights off)"));
  }
  if (work.admission != nullptr) {
    absl::Status held = work.admission->AtLeast(work.request_bytes + response);
    if (!held.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat(held.message(), "; the append was not applied"));
    }
  }
  try {
    out.output = OutputTensor::Sized(a.out_dtype, {t, e});
    int64_t buffers = 0;
    if (a.out_dtype == DType::kFloat32) {
      step.output = reinterpret_cast<float*>(out.output.bytes.data());
    } else {
      a.output.resize(static_cast<size_t>(t * e));
      step.output = a.output.data();
      buffers += t * e;
    }
    if (step.need_weights) {
      a.weights_shape =
          step.average_weights ? Shape{t, columns} : Shape{spec.num_heads, t, columns};
      // Allocated now: nothing after the engine run may fail.
      out.attn_weights = OutputTensor::Sized(a.out_dtype, a.weights_shape);
      if (a.out_dtype == DType::kFloat32) {
        step.weights = reinterpret_cast<float*>(out.attn_weights->bytes.data());
      } else {
        a.weights.resize(static_cast<size_t>(NumElements(a.weights_shape)));
        step.weights = a.weights.data();
        buffers += NumElements(a.weights_shape);
      }
    }
    a.charge = MeterCharge(buffers * static_cast<int64_t>(sizeof(float)));
  } catch (const std::bad_alloc&) {
    out.output = OutputTensor();
    out.attn_weights.reset();
    return absl::ResourceExhaustedError(
        "out of memory for the append's results; it was not applied; retry later");
  }
  if (!session.cross) return manager.Reserve(session, t);
  return absl::OkStatus();
}

}  // namespace

std::vector<RequestOutcome> RunSessionBatch(
    SessionManager& manager, SessionModel& model,
    const std::vector<std::unique_ptr<PendingRequest>>& batch, BatchStats* stats) {
  const SessionEngine& engine = *model.engine;
  const int64_t e = engine.spec().embed_dim;
  std::vector<RequestOutcome> outcomes(batch.size());
  std::vector<Admitted> admitted;
  admitted.reserve(batch.size());
  for (size_t b = 0; b < batch.size(); ++b) {
    const PendingRequest& r = *batch[b];
    SessionWork& work = *r.session;
    Session& session = *work.session;
    RequestOutcome& out = outcomes[b];
    out.batch_requests = static_cast<int>(batch.size());
    {
      absl::MutexLock lock(&session.mu);
      if (!session.ended.empty()) {
        out.status = absl::NotFoundError(absl::StrCat("session_id: session '", session.id, "' ",
                                                      session.ended, " before this append ran"));
        continue;
      }
      if (work.expected_length && *work.expected_length != session.length) {
        out.status = absl::FailedPreconditionError(absl::StrCat(
            "expected_length: the session holds ", session.length, " tokens, the append expected ",
            *work.expected_length,
            "; it was not applied (an earlier append was lost or applied twice, or the session's "
            "routing key moved back to a replica holding an older copy): re-create the session "
            "and re-send its prefix"));
        continue;
      }
    }
    if (work.kind == SessionWork::Kind::kInitCross) {
      out.status = manager.Reserve(session, work.key_count);
      if (out.status.ok()) out.status = engine.InitCross(work.cross, session.cache.get());
      if (out.status.ok()) manager.Committed(session, 0);
      continue;
    }
    if (absl::Now() >= r.deadline) {  // Expired while the batch waited to compute.
      out.status = absl::DeadlineExceededError(
          "deadline passed before the append computed; it was not applied");
      continue;
    }
    const int64_t t = work.tokens.dim(0);
    const int64_t length = session.cross ? session.position : session.cache->length();
    if (length + t > model.max_session_tokens) {
      out.status = absl::FailedPreconditionError(
          session.cross
              ? absl::StrCat("tokens: this cross session has been sent ", length, " queries; ", t,
                             " more would pass the model's max_session_tokens ",
                             model.max_session_tokens,
                             ", which caps the queries a cross session takes over its life (they "
                             "are not stored; it holds ",
                             session.cache->length(), " keys); create a new session")
              : absl::StrCat("tokens: appending ", t, " tokens to a session holding ", length,
                             " would pass the model's max_session_tokens ",
                             model.max_session_tokens,
                             " (its config.json's max_session_tokens, else --max_session_tokens)"));
      continue;
    }
    Admitted a;
    a.index = b;
    out.status = Admit(manager, model, r, out, a);
    if (!out.status.ok()) {
      out.output = OutputTensor();
      out.attn_weights.reset();
      continue;
    }
    stats->real_tokens += t;
    stats->flops += 2.0 * t * e * e * (session.cross ? 2 : 4) +
                    4.0 * t * (session.cross ? a.step.cache->length() : length + t) * e;
    admitted.push_back(std::move(a));
  }
  stats->padded_tokens = stats->real_tokens;
  if (admitted.empty()) return outcomes;

  std::vector<SessionStep> steps;
  steps.reserve(admitted.size());
  for (const Admitted& a : admitted) steps.push_back(a.step);
  const absl::Status status = engine.Run(steps, /*commit=*/false);
  const absl::Time now = absl::Now();
  // From here nothing allocates: every append is either committed with its
  // response complete, or dropped with its session unchanged.
  for (Admitted& a : admitted) {
    RequestOutcome& out = outcomes[a.index];
    const PendingRequest& r = *batch[a.index];
    Session& session = *r.session->session;
    out.status = status;
    // An append whose caller has given up is not applied: it would change
    // the session behind the back of a client told it failed.
    if (out.status.ok() && now >= r.deadline) {
      out.status = absl::DeadlineExceededError(
          "deadline passed while the append computed; it was not applied");
    } else if (out.status.ok() && r.is_cancelled && r.is_cancelled()) {
      out.status = absl::CancelledError("append was cancelled; it was not applied");
    }
    if (!out.status.ok()) {
      out.output = OutputTensor();
      out.attn_weights.reset();
      continue;
    }
    const int64_t t = a.step.tokens.dim(0);
    if (a.out_dtype != DType::kFloat32) {
      ConvertFloats(DType::kFloat32, a.output.data(), a.out_dtype, out.output.bytes.data(),
                    a.output.size());
    }
    if (a.step.need_weights && a.out_dtype != DType::kFloat32) {
      ConvertFloats(DType::kFloat32, a.weights.data(), a.out_dtype, out.attn_weights->bytes.data(),
                    a.weights.size());
    }
    if (session.cross) {
      session.position += t;
    } else {
      session.cache->Commit(session.cache->length() + t);
    }
    manager.Committed(session, t);
    out.session_length = session.cross ? session.position : session.cache->length();
    model.served->metrics->session_tokens->Increment(static_cast<double>(t));
  }
  return outcomes;
}

void InstallSessionRunner(SessionManager& manager, const ServedModel& served) {
  SessionModel* model = manager.model(&served);
  if (model == nullptr) return;
  served.batcher->SetSessionRunner(
      [&manager, model](const std::vector<std::unique_ptr<PendingRequest>>& batch,
                        BatchStats* stats) {
        return RunSessionBatch(manager, *model, batch, stats);
      });
}

void InstallSessionRunners(SessionManager& manager, const ModelRepository& repository) {
  for (const ModelRef& served : ServingVersions(repository)) InstallSessionRunner(manager, *served);
}

}  // namespace attention::server
