#include "server/sessions/session_path.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "proto/codec/routing_key.h"
#include "server/requests/identifiers.h"
#include "server/sessions/append_size.h"

namespace attention::server {

absl::StatusOr<std::shared_ptr<Session>> SessionPath::FindForCaller(SessionManager* manager,
                                                                    const CallContext& call,
                                                                    const std::string& id) const {
  ASSIGN_OR_RETURN(std::shared_ptr<const Principal> principal, requests_->Authenticate(call));
  RETURN_IF_ERROR(CheckIdentifier(id, "session_id"));
  if (id.empty()) {
    return absl::InvalidArgumentError(
        "session_id: required (the id CreateSession returned), got an empty one");
  }
  absl::StatusOr<std::shared_ptr<Session>> found = manager->Find(id, call.leases.get());
  if (found.status().code() == absl::StatusCode::kNotFound && wire::RoutingKeyOf(id).empty()) {
    return absl::NotFoundError(absl::StrCat(
        found.status().message(), " (behind a gateway, create sessions with the metadata header ",
        wire::kRoutingHeader, ": <key> so that their calls reach the replica holding them)"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, std::move(found));
  if (principal != nullptr) {
    // Owned by the token entry (its hash), not by its name: two entries may share a name.
    if (session->owner != principal->id) {
      return absl::PermissionDeniedError(
          absl::StrCat("session_id: the session belongs to another token than this caller's ('",
                       principal->name, "')"));
    }
    RETURN_IF_ERROR(requests_->FindModel(principal.get(), session->model->served->name).status());
  }
  return session;
}

absl::Status SessionPath::CheckRouting(const std::string& id,
                                       const std::optional<std::string>& header, bool stream) {
  const absl::string_view key = wire::RoutingKeyOf(id);
  if (key.empty() || header == key) return absl::OkStatus();
  // A stream opened without a key was not routed by one (a direct
  // connection): it may carry appends of several sessions, as SessionStream
  // always could; through a gateway, those not held where it landed are
  // NOT_FOUND with the hint to route.
  if (stream && !header) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      wire::kRoutingHeader, ": session '", Shown(id), "' was created with the routing key '",
      Shown(key), "' (after the '.' in its id), and its calls carry the metadata header '",
      wire::kRoutingHeader, ": ", Shown(key), "', by which a gateway sends them to its replica; ",
      stream ? "this stream" : "this call",
      header ? absl::StrCat(" carries '", Shown(*header), "'") : " has none",
      stream ? " (a stream is routed as a whole by the header it opens with: open one stream per "
               "session key)"
             : ""));
}

SessionManager* SessionPath::ReadyManager(absl::Status* status) const {
  SessionManager* manager = manager_.load();
  if (manager == nullptr) *status = absl::UnavailableError("server is not ready yet");
  return manager;
}

int64_t SessionPath::HeldKeys(const std::shared_ptr<Session>& session, int64_t tokens,
                              std::shared_ptr<void>* queued) {
  int64_t held;
  {
    absl::MutexLock lock(&session->mu);
    held =
        session->cross ? session->keys : session->keys + session->queued_tokens.fetch_add(tokens);
  }
  if (session->cross) return held;
  *queued = std::shared_ptr<void>(
      nullptr, [session, tokens](void*) { session->queued_tokens.fetch_sub(tokens); });
  return held;
}

absl::Status SessionPath::PrepareStep(const Step& step, const SessionModel& m, bool cross,
                                      int64_t held_keys, std::shared_ptr<const void> keep_alive,
                                      const CallContext& call, PreparedAppend* prepared) const {
  prepared->model = m.served;
  auto work = std::make_unique<SessionWork>();
  work->tokens = step.tokens;
  work->not_key = step.not_key;
  RETURN_IF_ERROR(m.engine->ValidateStep(cross, work->tokens, work->not_key));
  const int64_t t = work->tokens.dim(0);
  const BatchingOptions& batching = m.served->batcher->options();
  if (t > batching.max_batch_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens: ", t, " tokens in one append exceed the model's max_batch_tokens ",
                     batching.max_batch_tokens,
                     " (its config.json's max_batch_tokens, else the server's --max_batch_tokens); "
                     "append them in chunks"));
  }
  if (step.expected_length && *step.expected_length < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected_length: expected the session's length (>= 0), got ", *step.expected_length));
  }
  work->expected_length = step.expected_length;
  if (step.output_dtype == DType::kBool) {
    return absl::InvalidArgumentError(
        "output_dtype: expected float32, bfloat16 or float16, got bool");
  }
  auto pending = std::make_unique<PendingRequest>();
  MhaInputs& in = pending->inputs;
  in.need_weights = step.need_weights;
  in.average_attn_weights = step.average_attn_weights;
  in.output_dtype = step.output_dtype;
  // The response: output, and weights over every key held after the append
  // (at most: appends queued before it may still fail). It is sized again,
  // exactly, when the append runs.
  const MhaSpec& spec = m.engine->spec();
  const DType out_dtype = in.output_dtype.value_or(work->tokens.dtype);
  const int64_t columns =
      std::min(held_keys + (cross ? 0 : t), m.max_session_tokens) + spec.extra_keys();
  const int64_t max_response = requests_->options().max_response_bytes;
  prepared->response_bytes =
      AppendResponseBytes(spec, t, columns, out_dtype, in.need_weights, in.average_attn_weights,
                          static_cast<int64_t>(step.id_bytes));
  if (prepared->response_bytes > max_response) {
    return absl::ResourceExhaustedError(
        absl::StrCat("response: would be about ", prepared->response_bytes,
                     " bytes, over the server's --max_message_bytes ", max_response,
                     "; append fewer tokens or leave need_weights off"));
  }
  pending->working_bytes = AppendWorkingBytes(*m.engine, t, columns, out_dtype, in.need_weights,
                                              in.average_attn_weights);
  if (pending->working_bytes > batching.max_working_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tokens: computing this append takes about ", pending->working_bytes,
        " bytes of working memory (its projections",
        in.need_weights ? " and attention weights over " : "",
        in.need_weights ? absl::StrCat(columns, " keys") : "", "), over the server's limit of ",
        batching.max_working_bytes, " per batch (--max_batch_working_bytes); append fewer tokens",
        in.need_weights ? " or leave need_weights off" : ""));
  }
  pending->call.batch = 1;
  pending->call.queries = t;
  pending->call.keys = t;
  // The fair queue's cost: its projections and its rows over `columns` keys.
  {
    const double tokens = static_cast<double>(t), e = static_cast<double>(spec.embed_dim);
    pending->cost = 4.0 * tokens * e * e +
                    2.0 * tokens * static_cast<double>(spec.kdim + spec.vdim) * e +
                    4.0 * tokens * static_cast<double>(columns) * e;
  }
  pending->keep_alive = std::move(keep_alive);
  RETURN_IF_ERROR(requests_->Tag(call, *m.served, pending.get()));
  work->kind = SessionWork::Kind::kAppend;
  work->max_response_bytes = max_response;
  work->id_bytes = static_cast<int64_t>(step.id_bytes);
  pending->session = std::move(work);
  prepared->pending = std::move(pending);
  return absl::OkStatus();
}

void SessionPath::Attach(std::shared_ptr<Session> session, std::shared_ptr<void> queued,
                         Admission* admission, int64_t request_bytes,
                         PreparedAppend* prepared) const {
  SessionWork& work = *prepared->pending->session;
  work.queued = std::move(queued);
  work.session = session;
  work.admission = admission;
  work.request_bytes = request_bytes;
  prepared->session = std::move(session);
}

}  // namespace attention::server
