#include "client/cli/session_client.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli/client_util.h"
#include "proto/codec/routing_key.h"
#include "proto/codec/tensor_codec.h"

namespace attention::client {
namespace {

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// Whether `status` means the session is lost (re-create and replay it);
// *stale when it is alive but diverged (expected_length).
bool Lost(const absl::Status& status, bool* stale) {
  *stale = status.code() == absl::StatusCode::kFailedPrecondition &&
           absl::StartsWith(status.message(), "expected_length:");
  return *stale || status.code() == absl::StatusCode::kNotFound ||
         status.code() == absl::StatusCode::kUnavailable;
}

// Consecutive chunks of `history` with one dtype, concatenated into appends
// of at most `max_tokens` (a longer chunk goes alone, as it went first).
std::vector<Tensor> Merged(const std::vector<Tensor>& history, int64_t max_tokens) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < history.size();) {
    size_t end = i + 1;
    int64_t rows = history[i].dim(0);
    while (end < history.size() && history[end].dtype() == history[i].dtype() &&
           rows + history[end].dim(0) <= max_tokens) {
      rows += history[end++].dim(0);
    }
    Tensor merged = Tensor::Uninitialized(history[i].dtype(), {rows, history[i].dim(1)});
    char* at = static_cast<char*>(merged.data());
    for (; i < end; ++i) {
      std::memcpy(at, history[i].data(), history[i].num_bytes());
      at += history[i].num_bytes();
    }
    out.push_back(std::move(merged));
  }
  return out;
}

}  // namespace

SessionClient::SessionClient(std::string target, std::string lb_policy, int64_t deadline_ms)
    : lb_policy_(std::move(lb_policy)),
      deadline_ms_(deadline_ms),
      default_(v1::SessionService::NewStub(MakeChannel(target, lb_policy_))) {}

v1::SessionService::Stub* SessionClient::StubFor(const std::string& session_id) {
  const size_t at = session_id.find('@');
  if (at == std::string::npos) return default_.get();
  const std::string address = session_id.substr(at + 1);
  absl::MutexLock lock(&mu_);
  auto& stub = replicas_[address];
  if (stub == nullptr) stub = v1::SessionService::NewStub(MakeChannel(address, "pick_first"));
  return stub.get();
}

void SessionClient::SetRoutingKey(grpc::ClientContext* context, const std::string& session_id) {
  const absl::string_view key = wire::RoutingKeyOf(session_id);
  if (!key.empty()) context->AddMetadata(wire::kRoutingHeader, std::string(key));
}

absl::StatusOr<v1::SessionInfo> SessionClient::Create(const v1::CreateSessionRequest& request,
                                                      std::string key) {
  grpc::ClientContext context;
  SetDeadline(&context, deadline_ms_);
  context.AddMetadata(wire::kRoutingHeader, key.empty() ? wire::NewRoutingKey() : key);
  v1::SessionInfo info;
  const grpc::Status status = default_->CreateSession(&context, request, &info);
  if (!status.ok()) return FromGrpc(status);
  return info;
}

absl::StatusOr<v1::AppendResponse> SessionClient::Append(const v1::AppendRequest& request) {
  grpc::ClientContext context;
  SetDeadline(&context, deadline_ms_);
  SetRoutingKey(&context, request.session_id());
  v1::AppendResponse response;
  const grpc::Status status = StubFor(request.session_id())->Append(&context, request, &response);
  if (!status.ok()) return FromGrpc(status);
  return response;
}

absl::StatusOr<v1::AppendResponse> SessionClient::AppendResending(const v1::AppendRequest& request,
                                                                  int* resends) {
  if (!request.has_expected_length()) {
    return absl::InvalidArgumentError(
        "expected_length: required to send an append again (AppendResending), absent");
  }
  static constexpr absl::Duration kBackoff[kMaxResends] = {
      absl::Milliseconds(50), absl::Milliseconds(200), absl::Milliseconds(500)};
  absl::StatusOr<v1::AppendResponse> response = Append(request);
  for (int resend = 0;
       resend < kMaxResends && response.status().code() == absl::StatusCode::kUnavailable;
       ++resend) {
    absl::SleepFor(kBackoff[resend]);
    if (resends != nullptr) ++*resends;
    response = Append(request);
    bool refused = false;  // FAILED_PRECONDITION "expected_length: ...".
    if (!response.ok()) (void)Lost(response.status(), &refused);
    if (!refused) continue;
    // Refused for its expected_length: the first attempt may have been applied.
    const int64_t tokens = request.tokens().shape_size() > 0 ? request.tokens().shape(0) : 0;
    auto info = Get(request.session_id());
    if (info.ok() && info->length() == request.expected_length() + tokens) {
      return absl::DataLossError(absl::StrCat(
          "append to session ", request.session_id(), " at length ", request.expected_length(),
          ": applied, but its answer was lost when the call was cut (UNAVAILABLE); the session "
          "holds ",
          info->length(), " tokens"));
    }
  }
  return response;
}

absl::StatusOr<v1::SessionInfo> SessionClient::Get(const std::string& session_id) {
  grpc::ClientContext context;
  SetDeadline(&context, deadline_ms_);
  SetRoutingKey(&context, session_id);
  v1::GetSessionRequest request;
  request.set_session_id(session_id);
  v1::SessionInfo info;
  const grpc::Status status = StubFor(session_id)->GetSession(&context, request, &info);
  if (!status.ok()) return FromGrpc(status);
  return info;
}

absl::StatusOr<int64_t> SessionClient::Close(const std::string& session_id) {
  grpc::ClientContext context;
  SetDeadline(&context, deadline_ms_);
  SetRoutingKey(&context, session_id);
  v1::CloseSessionRequest request;
  request.set_session_id(session_id);
  v1::CloseSessionResponse response;
  const grpc::Status status = StubFor(session_id)->CloseSession(&context, request, &response);
  if (!status.ok()) return FromGrpc(status);
  return response.freed_bytes();
}

ReplayingSession::ReplayingSession(SessionClient* client, std::string model,
                                   int64_t replay_chunk_tokens)
    : client_(client),
      model_(std::move(model)),
      replay_chunk_tokens_(std::max<int64_t>(1, replay_chunk_tokens)) {}

absl::Status ReplayingSession::Recreate(bool stale) {
  if (stale && !id_.empty()) (void)client_->Close(id_);  // Frees the diverged copy.
  id_.clear();
  v1::CreateSessionRequest create;
  create.set_model(model_);
  create.set_kind(v1::SESSION_KIND_SELF);
  auto info = client_->Create(create);  // Under a fresh key.
  if (!info.ok()) return info.status();
  const std::string id = info->session_id();
  int64_t length = 0;
  for (const Tensor& chunk : Merged(history_, replay_chunk_tokens_)) {
    v1::AppendRequest request;
    request.set_session_id(id);
    request.set_expected_length(length);
    wire::EncodeTensor(chunk, request.mutable_tokens());
    auto replayed = client_->Append(request);
    if (!replayed.ok()) {
      (void)client_->Close(id);  // Never append to a partly replayed session.
      return replayed.status();
    }
    length = replayed->length();
    replayed_tokens_ += chunk.dim(0);
  }
  id_ = id;
  length_ = length;
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ReplayingSession::Append(const Tensor& tokens) {
  bool lost = false;   // The session must be re-created (and replayed) first.
  bool stale = false;  // It is alive but diverged: close it first.
  absl::Status status;
  for (int attempt = 0; attempt <= kMaxRecoveries; ++attempt) {
    if (id_.empty() || lost) {  // The first creation (or one after Close) is no recovery.
      status = Recreate(stale);
      stale = false;  // A failed copy was closed.
      if (!status.ok()) {
        bool diverged = false;
        if (!Lost(status, &diverged)) return status;
        continue;
      }
      if (lost) ++recoveries_;
      lost = false;
    }
    v1::AppendRequest request;
    request.set_session_id(id_);
    request.set_expected_length(length_);
    wire::EncodeTensor(tokens, request.mutable_tokens());
    request.set_output_dtype(v1::DATA_TYPE_FLOAT32);
    auto response = client_->Append(request);
    if (response.ok()) {
      history_.push_back(tokens.Clone());
      length_ = response->length();
      return wire::DecodeTensorCopy(response->output(), "output");
    }
    status = response.status();
    if (!Lost(status, &stale)) return status;
    lost = true;
  }
  return status;
}

void ReplayingSession::Close() {
  if (!id_.empty()) (void)client_->Close(id_);
  id_.clear();
}

}  // namespace attention::client
