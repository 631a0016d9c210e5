#include "server/frontends/grpc/session_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "proto/codec/routing_key.h"
#include "proto/codec/status_codes.h"
#include "proto/codec/tensor_codec.h"
#include "server/frontends/grpc/admitted_reactor.h"
#include "server/frontends/grpc/grpc_call.h"
#include "server/frontends/grpc/stream_reactor.h"
#include "server/frontends/protocol/message_limit.h"
#include "server/requests/identifiers.h"

namespace attention::server {
namespace {

int64_t UnixMillis(absl::Time t) { return absl::ToUnixMillis(t); }

// The call's x-attention-session metadata, if it has one.
std::optional<std::string> RoutingHeader(grpc::CallbackServerContext* context) {
  if (context == nullptr) return std::nullopt;
  const auto& metadata = context->client_metadata();
  const auto it = metadata.find(wire::kRoutingHeader);
  if (it == metadata.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

void DescribeSession(const SessionSnapshot& s, v1::SessionInfo* info) {
  info->set_session_id(s.id);
  info->set_model(s.model);
  info->set_kind(s.cross ? v1::SESSION_KIND_CROSS : v1::SESSION_KIND_SELF);
  info->set_length(s.length);
  info->set_keys(s.keys);
  info->set_bytes(s.bytes);
  info->set_created_unix_ms(UnixMillis(s.created));
  info->set_last_used_unix_ms(UnixMillis(s.last_used));
  info->set_ttl_s(absl::ToInt64Seconds(s.ttl));
  info->set_max_tokens(s.max_tokens);
  info->set_model_version(s.model_version);
}

SessionServiceImpl::SessionServiceImpl(SessionPath* sessions)
    : sessions_(sessions), requests_(&sessions->requests()) {}

grpc::ServerUnaryReactor* SessionServiceImpl::CreateSession(grpc::CallbackServerContext* context,
                                                            const v1::CreateSessionRequest* request,
                                                            v1::SessionInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time received = absl::Now();
  requests_->Received();
  const CallRef call = CallOf(context, Method::kCreateSession);
  const ServedModel* served = nullptr;
  absl::Status status;
  auto finish = [this, reactor, received, call, context](const ServedModel* model,
                                                         const absl::Status& s) {
    requests_->Answered(model, *call, s, received);
    reactor->Finish(wire::ToGrpcStatus(s, context));
  };
  SessionManager* manager = sessions_->ReadyManager(&status);
  if (manager != nullptr && requests_->draining()) {
    status = absl::UnavailableError("server is shutting down");
  }
  std::string owner;
  const std::string key = RoutingHeader(context).value_or("");
  if (status.ok() && RoutingHeader(context)) status = wire::CheckRoutingKey(key);
  if (status.ok()) {
    auto principal = requests_->Authenticate(*call);
    absl::StatusOr<const ServedModel*> found =
        principal.ok() ? requests_->FindModel(principal->get(), request->model(), 0, call.get())
                       : absl::StatusOr<const ServedModel*>(principal.status());
    status = found.status();
    if (found.ok()) served = *found;
    if (principal.ok() && *principal != nullptr) owner = (*principal)->id;
  }
  // The version is held by the call's leases, so its session state stays
  // (even if it is unloaded meanwhile: then Create refuses it).
  SessionModel* session_model = status.ok() ? manager->model(served) : nullptr;
  if (status.ok() && session_model == nullptr) {
    status = absl::InternalError(absl::StrCat("model: version ", served->version, " of '",
                                              served->name, "' has no session state"));
  }
  const bool cross = request->kind() == v1::SESSION_KIND_CROSS;
  if (status.ok() && request->kind() != v1::SESSION_KIND_SELF && !cross) {
    status = absl::InvalidArgumentError(
        absl::StrCat("kind: expected SESSION_KIND_SELF or SESSION_KIND_CROSS, got ",
                     v1::SessionKind_Name(request->kind())));
  }
  const int64_t max_ttl_s =
      manager != nullptr ? absl::ToInt64Seconds(manager->options().max_ttl) : 0;
  if (status.ok() && (request->ttl_s() < 0 || request->ttl_s() > max_ttl_s)) {
    status = absl::InvalidArgumentError(
        absl::StrCat("ttl_s: expected 0 (the model's default) to ", max_ttl_s,
                     " (the server's --max_session_ttl_s), got ", request->ttl_s()));
  }
  auto work = std::make_unique<SessionWork>();
  if (status.ok() && cross) {
    status = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(work->cross.key, wire::DecodeTensor(request->key(), "key"));
      ASSIGN_OR_RETURN(std::optional<TensorView> value,
                       wire::DecodeOptionalTensor(request->value(), "value"));
      work->cross.value = value ? *value : work->cross.key;
      ASSIGN_OR_RETURN(work->cross.key_padding_mask,
                       wire::DecodeOptionalTensor(request->key_padding_mask(), "key_padding_mask"));
      SessionModel* m = session_model;
      RETURN_IF_ERROR(m->engine->ValidateCross(work->cross));
      work->key_count = work->cross.key.dim(0);
      const int64_t working = m->engine->CrossWorkingBytes(work->key_count);
      const int64_t limit = served->batcher->options().max_working_bytes;
      if (working > limit) {
        return absl::ResourceExhaustedError(
            absl::StrCat("key: projecting ", work->key_count, " keys takes about ", working,
                         " bytes of working memory, over the server's limit of ", limit,
                         " per batch (--max_batch_working_bytes); send fewer keys"));
      }
      if (work->key_count > m->max_session_tokens) {
        return absl::FailedPreconditionError(
            absl::StrCat("key: ", work->key_count, " keys exceed the model's max_session_tokens ",
                         m->max_session_tokens,
                         " (its config.json's max_session_tokens, else --max_session_tokens)"));
      }
      return absl::OkStatus();
    }();
  } else if (status.ok() &&
             (request->has_key() || request->has_value() || request->has_key_padding_mask())) {
    status = absl::InvalidArgumentError(
        "key: a self-attention session takes no key, value or key_padding_mask; its appended "
        "tokens are its keys");
  }
  if (status.ok() && !cross) status = session_model->engine->SupportsSelf();
  // A cross session's keys are projected on the batcher: its tenant and rate
  // first, so that a call over the caller's rate holds, creates and evicts
  // nothing (creating may evict the caller's own idle sessions).
  auto pending = std::make_unique<PendingRequest>();
  if (status.ok() && cross) status = requests_->Tag(*call, *served, pending.get());
  // A cross session's keys and values are held until projected.
  const int64_t admitted = cross ? static_cast<int64_t>(request->ByteSizeLong()) : 0;
  if (status.ok() && cross) status = requests_->Admit(admitted);
  std::shared_ptr<Session> session;
  bool existing = false;  // A retry given the session it created.
  if (status.ok()) {
    auto created = manager->Create(served, cross, request->is_causal(),
                                   absl::Seconds(request->ttl_s()), owner, key, &existing);
    status = created.status();
    if (created.ok()) session = *std::move(created);
    if (!status.ok()) requests_->Release(admitted);
  }
  if (!status.ok()) {
    finish(served, status);
    return reactor;
  }
  if (!cross || existing) {
    DescribeSession(manager->Snapshot(*session), response);
    finish(served, absl::OkStatus());
    return reactor;
  }
  // The keys are projected on the batcher; the request's bytes live until Finish.
  pending->working_bytes = session_model->engine->CrossWorkingBytes(work->key_count);
  {  // The fair queue's cost: projecting the fixed keys and values.
    const MhaSpec& spec = session_model->engine->spec();
    pending->cost = 2.0 * static_cast<double>(work->key_count) *
                    static_cast<double>(spec.kdim + spec.vdim) *
                    static_cast<double>(spec.embed_dim);
  }
  work->kind = SessionWork::Kind::kInitCross;
  work->session = session;
  pending->session = std::move(work);
  pending->done = [this, manager, session, response, finish, served,
                   admitted](RequestOutcome outcome) {
    requests_->Release(admitted);
    if (outcome.status.ok()) {
      DescribeSession(manager->Snapshot(*session), response);
    } else {
      (void)manager->Close(session->id);
    }
    finish(served, outcome.status);
  };
  status = manager->Submit(session, std::move(pending));
  if (!status.ok()) {
    requests_->Release(admitted);
    (void)manager->Close(session->id);
    finish(served, status);
  }
  return reactor;
}

absl::Status SessionServiceImpl::PrepareAppend(const v1::AppendRequest& request,
                                               const std::optional<std::string>& routing,
                                               bool stream, std::shared_ptr<const void> keep_alive,
                                               const CallContext& call, PreparedAppend* prepared) {
  absl::Status status;
  SessionManager* manager = sessions_->ReadyManager(&status);
  if (manager == nullptr) return status;
  if (requests_->draining()) return absl::UnavailableError("server is shutting down");
  RETURN_IF_ERROR(CheckIdentifier(request.request_id(), "request_id"));
  RETURN_IF_ERROR(CheckIdentifier(request.session_id(), "session_id"));
  RETURN_IF_ERROR(SessionPath::CheckRouting(request.session_id(), routing, stream));
  ASSIGN_OR_RETURN(prepared->session,
                   sessions_->FindForCaller(manager, call, request.session_id()));
  Step step;
  ASSIGN_OR_RETURN(step.tokens, wire::DecodeTensor(request.tokens(), "tokens"));
  ASSIGN_OR_RETURN(step.not_key, wire::DecodeOptionalTensor(request.not_key(), "not_key"));
  step.need_weights = request.need_weights();
  step.average_attn_weights = !request.per_head_weights();
  if (request.output_dtype() != v1::DATA_TYPE_UNSPECIFIED) {
    ASSIGN_OR_RETURN(DType out, wire::FromProtoDType(request.output_dtype(), "output_dtype"));
    step.output_dtype = out;
  }
  step.id_bytes = request.request_id().size() + request.session_id().size();
  if (request.has_expected_length()) step.expected_length = request.expected_length();
  Session& session = *prepared->session;
  const int64_t t = step.tokens.rank() == 2 ? step.tokens.dim(0) : 0;
  const int64_t held = SessionPath::HeldKeys(prepared->session, t, &prepared->queued);
  return sessions_->PrepareStep(step, *session.model, session.cross, held, std::move(keep_alive),
                                call, prepared);
}

absl::Status SessionServiceImpl::EncodeAppend(RequestOutcome& outcome, int64_t model_version,
                                              v1::AppendResponse* response) const {
  OutputTensor& out = outcome.output;
  wire::EncodeTensorBytes(out.dtype, out.shape, std::move(out.bytes), response->mutable_output());
  if (outcome.attn_weights) {
    OutputTensor& w = *outcome.attn_weights;
    wire::EncodeTensorBytes(w.dtype, w.shape, std::move(w.bytes), response->mutable_attn_weights());
  }
  response->set_length(outcome.session_length);
  response->set_queue_us(outcome.queue_us);
  response->set_compute_us(outcome.compute_us);
  response->set_batch_requests(outcome.batch_requests);
  response->set_model_version(model_version);
  return CheckMessageLimit(response, requests_->options().max_response_bytes);
}

grpc::ServerUnaryReactor* SessionServiceImpl::Append(grpc::CallbackServerContext* context,
                                                     const v1::AppendRequest* request,
                                                     v1::AppendResponse* response) {
  auto* reactor = new AdmittedUnaryReactor();
  const absl::Time received = absl::Now();
  requests_->Received();
  const CallRef call = CallOf(context, Method::kAppend);
  response->set_session_id(request->session_id());
  response->set_request_id(request->request_id());
  PreparedAppend prepared;
  absl::Status status =
      PrepareAppend(*request, RoutingHeader(context), /*stream=*/false, nullptr, *call, &prepared);
  const ServedModel* model = prepared.model;
  const int64_t request_bytes = static_cast<int64_t>(request->ByteSizeLong());
  absl::StatusOr<std::shared_ptr<Admission>> held =
      status.ok() ? requests_->budget().Take(request_bytes + prepared.response_bytes)
                  : absl::StatusOr<std::shared_ptr<Admission>>(status);
  status = held.status();
  if (status.ok()) {
    sessions_->Attach(prepared.session, std::move(prepared.queued), held->get(), request_bytes,
                      &prepared);
    prepared.pending->done = [this, reactor, response, received, model, call,
                              held = *held](RequestOutcome outcome) mutable {
      absl::Status result = outcome.status;
      if (result.ok()) result = EncodeAppend(outcome, model->version, response);
      reactor->Hold(std::move(held));  // Until the response is sent.
      requests_->Answered(model, *call, result, received);
      reactor->Finish(wire::ToGrpcStatus(result));
    };
    status = sessions_->manager()->Submit(prepared.session, std::move(prepared.pending));
  }
  if (!status.ok()) {
    requests_->Answered(model, *call, status, received);
    reactor->Finish(wire::ToGrpcStatus(status, context));
  }
  return reactor;
}

grpc::ServerBidiReactor<v1::AppendRequest, v1::AppendResponse>* SessionServiceImpl::SessionStream(
    grpc::CallbackServerContext* context) {
  using Reactor = StreamReactor<v1::AppendRequest, v1::AppendResponse>;
  return new Reactor(
      requests_, context, Method::kSessionStream,
      [this, routing = RoutingHeader(context)](std::shared_ptr<v1::AppendRequest> request,
                                               const CallContext& call) {
        Reactor::Prepared out;
        auto prepared = std::make_shared<PreparedAppend>();
        out.status =
            PrepareAppend(*request, routing, /*stream=*/true, request, call, prepared.get());
        out.model = prepared->model;
        out.response_bytes = prepared->response_bytes;
        const std::string session_id = Echoed(request->session_id());
        const int64_t request_bytes = static_cast<int64_t>(request->ByteSizeLong());
        out.submit = [this, prepared, session_id, request_bytes](Reactor::Reply reply,
                                                                 Admission* admission) {
          sessions_->Attach(prepared->session, std::move(prepared->queued), admission,
                            request_bytes, prepared.get());
          const int64_t version = prepared->model->version;
          prepared->pending->done = [this, reply, session_id, version](RequestOutcome outcome) {
            v1::AppendResponse response;
            absl::Status result = outcome.status;
            if (result.ok()) result = EncodeAppend(outcome, version, &response);
            response.set_session_id(session_id);
            reply(std::move(response), result);
          };
          return sessions_->manager()->Submit(prepared->session, std::move(prepared->pending));
        };
        return out;
      });
}

grpc::ServerUnaryReactor* SessionServiceImpl::OnSession(
    grpc::CallbackServerContext* context, Method method, const std::string& id,
    absl::FunctionRef<absl::Status(SessionManager&, const std::shared_ptr<Session>&)> act) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time received = absl::Now();
  requests_->Received();
  const CallRef call = CallOf(context, method);
  absl::Status status;
  const ServedModel* model = nullptr;
  SessionManager* manager = sessions_->ReadyManager(&status);
  if (manager != nullptr) status = SessionPath::CheckRouting(id, RoutingHeader(context), false);
  if (status.ok()) {
    auto session = sessions_->FindForCaller(manager, *call, id);
    status = session.status();
    if (session.ok()) {
      model = (*session)->model->served;
      status = act(*manager, *session);
    }
  }
  requests_->Answered(model, *call, status, received);
  reactor->Finish(wire::ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* SessionServiceImpl::GetSession(grpc::CallbackServerContext* context,
                                                         const v1::GetSessionRequest* request,
                                                         v1::SessionInfo* response) {
  return OnSession(context, Method::kGetSession, request->session_id(),
                   [response](SessionManager& manager, const std::shared_ptr<Session>& session) {
                     DescribeSession(manager.Snapshot(*session), response);
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* SessionServiceImpl::CloseSession(grpc::CallbackServerContext* context,
                                                           const v1::CloseSessionRequest* request,
                                                           v1::CloseSessionResponse* response) {
  return OnSession(context, Method::kCloseSession, request->session_id(),
                   [request, response](SessionManager& manager, const std::shared_ptr<Session>&) {
                     auto freed = manager.Close(request->session_id());
                     if (freed.ok()) response->set_freed_bytes(*freed);
                     return freed.status();
                   });
}

}  // namespace attention::server
