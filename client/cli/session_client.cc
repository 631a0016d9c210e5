#include "client/cli/session_client.h"

#include "absl/strings/str_cat.h"
#include "client/cli/client_util.h"
#include "proto/codec/tensor_codec.h"

namespace attention::client {
namespace {

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
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

absl::StatusOr<v1::SessionInfo> SessionClient::Create(const v1::CreateSessionRequest& request) {
  grpc::ClientContext context;
  SetDeadline(&context, deadline_ms_);
  v1::SessionInfo info;
  const grpc::Status status = default_->CreateSession(&context, request, &info);
  if (!status.ok()) return FromGrpc(status);
  return info;
}

absl::StatusOr<v1::AppendResponse> SessionClient::Append(const v1::AppendRequest& request) {
  grpc::ClientContext context;
  SetDeadline(&context, deadline_ms_);
  v1::AppendResponse response;
  const grpc::Status status = StubFor(request.session_id())->Append(&context, request, &response);
  if (!status.ok()) return FromGrpc(status);
  return response;
}

absl::StatusOr<v1::SessionInfo> SessionClient::Get(const std::string& session_id) {
  grpc::ClientContext context;
  SetDeadline(&context, deadline_ms_);
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
  v1::CloseSessionRequest request;
  request.set_session_id(session_id);
  v1::CloseSessionResponse response;
  const grpc::Status status = StubFor(session_id)->CloseSession(&context, request, &response);
  if (!status.ok()) return FromGrpc(status);
  return response.freed_bytes();
}

ReplayingSession::ReplayingSession(SessionClient* client, std::string model)
    : client_(client), model_(std::move(model)) {}

absl::Status ReplayingSession::Recreate() {
  v1::CreateSessionRequest create;
  create.set_model(model_);
  create.set_kind(v1::SESSION_KIND_SELF);
  auto info = client_->Create(create);
  if (!info.ok()) return info.status();
  id_ = info->session_id();
  for (const Tensor& chunk : history_) {
    v1::AppendRequest request;
    request.set_session_id(id_);
    wire::EncodeTensor(chunk, request.mutable_tokens());
    auto replayed = client_->Append(request);
    if (!replayed.ok()) return replayed.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ReplayingSession::Append(const Tensor& tokens) {
  if (id_.empty()) {
    const absl::Status created = Recreate();
    if (!created.ok()) return created;
  }
  for (int attempt = 0;; ++attempt) {
    v1::AppendRequest request;
    request.set_session_id(id_);
    wire::EncodeTensor(tokens, request.mutable_tokens());
    request.set_output_dtype(v1::DATA_TYPE_FLOAT32);
    auto response = client_->Append(request);
    if (response.ok()) {
      history_.push_back(tokens.Clone());
      return wire::DecodeTensorCopy(response->output(), "output");
    }
    const absl::StatusCode code = response.status().code();
    if (attempt > 0 ||
        (code != absl::StatusCode::kNotFound && code != absl::StatusCode::kUnavailable)) {
      return response.status();
    }
    ++recoveries_;
    const absl::Status recreated = Recreate();
    if (!recreated.ok()) return recreated;
  }
}

void ReplayingSession::Close() {
  if (!id_.empty()) (void)client_->Close(id_);
  id_.clear();
}

}  // namespace attention::client
