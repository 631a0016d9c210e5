// ChurnCalls' session calls: attention.v1 sessions (unary and SessionStream)
// and the inference protocol's sequences; the rest is in churn_calls.cc.
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/fixture/server_test_util.h"
#include "tests/model_lifecycle/churn/churn_calls.h"
#include "tests/model_lifecycle/churn/churn_wire.h"

namespace attention::churn_test {

using model_versions_test::Reference;
using testing::FromProto;
using testing::RandomTensor;
using testing::ToProto;

grpc::StatusCode ChurnCalls::Session(std::mt19937& rng, bool stream) {
  v1::SessionInfo info;
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::CreateSessionRequest request;
    request.set_model("m");
    request.set_kind(v1::SESSION_KIND_SELF);
    const grpc::Status status = sessions_->CreateSession(&context, request, &info);
    if (!status.ok()) return status.error_code();
  }
  const Tensor all = RandomTensor({1, 6, kE}, rng);
  const int64_t version = info.model_version();
  grpc::StatusCode code = grpc::StatusCode::OK;
  auto check = [&](const v1::AppendResponse& r, int64_t at, const char* what) {
    if (r.model_version() != version) {
      Wrong(
          absl::StrCat(what, ": session of version ", version, " answered by ", r.model_version()));
    }
    CheckCausal(version, Rows(all, 0, 6), at, FromProto(r.output()), what);
  };
  if (stream) {
    grpc::ClientContext context;
    SetDeadline(&context);
    auto appends = sessions_->SessionStream(&context);
    for (int64_t at = 0; at < 6; at += 2) {
      v1::AppendRequest request;
      request.set_session_id(info.session_id());
      request.set_request_id(std::to_string(at));
      ToProto(Tensor::FromBytes(DType::kFloat32, {2, kE}, Rows(all, at, 2).data()),
              request.mutable_tokens());
      if (!appends->Write(request)) break;
    }
    appends->WritesDone();
    v1::AppendResponse response;
    while (appends->Read(&response)) {
      if (response.has_error()) {
        code = static_cast<grpc::StatusCode>(response.error().code());
        EXPECT_TRUE(Allowed(code)) << "SessionStream append: " << response.error().message();
      } else {
        check(response, std::atoi(response.request_id().c_str()), "SessionStream");
      }
    }
    const grpc::Status status = appends->Finish();
    if (!status.ok()) code = status.error_code();
  } else {
    for (int64_t at = 0; at < 6 && code == grpc::StatusCode::OK; at += 3) {
      grpc::ClientContext context;
      SetDeadline(&context);
      v1::AppendRequest request;
      request.set_session_id(info.session_id());
      request.set_expected_length(at);
      ToProto(Tensor::FromBytes(DType::kFloat32, {3, kE}, Rows(all, at, 3).data()),
              request.mutable_tokens());
      v1::AppendResponse response;
      const grpc::Status status = sessions_->Append(&context, request, &response);
      code = status.error_code();
      if (status.ok()) check(response, at, "Append");
    }
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::GetSessionRequest get;
    get.set_session_id(info.session_id());
    v1::SessionInfo got;
    const grpc::Status status = sessions_->GetSession(&context, get, &got);
    EXPECT_TRUE(Allowed(status.error_code())) << "GetSession: " << status.error_message();
    if (status.ok() && got.model_version() != version) Wrong("GetSession: another version");
  }
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::CloseSessionRequest close;
  close.set_session_id(info.session_id());
  v1::CloseSessionResponse closed;
  const grpc::Status status = sessions_->CloseSession(&context, close, &closed);
  EXPECT_TRUE(Allowed(status.error_code())) << "CloseSession: " << status.error_message();
  return code;
}

grpc::StatusCode ChurnCalls::Sequence(std::mt19937& rng) {
  const Tensor all = RandomTensor({1, 4, kE}, rng);
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_sequence_++;
  }
  int64_t version = -1;
  for (int64_t at = 0; at < 4; at += 2) {
    inference::ModelInferRequest request = OipRequest(Rows(all, at, 2));
    (*request.mutable_parameters())["sequence_id"].set_uint64_param(id);
    (*request.mutable_parameters())["expected_length"].set_int64_param(at);
    if (at == 0) (*request.mutable_parameters())["sequence_start"].set_bool_param(true);
    if (at == 2) (*request.mutable_parameters())["sequence_end"].set_bool_param(true);
    grpc::ClientContext context;
    SetDeadline(&context);
    inference::ModelInferResponse response;
    const grpc::Status status = oip_->ModelInfer(&context, request, &response);
    if (!status.ok()) return status.error_code();
    const int64_t v = VersionOf(response.model_version());
    if (at == 0) version = v;
    if (v != version) Wrong(absl::StrCat("Sequence: started on ", version, ", step on ", v));
    const Tensor out = OipOutput(response, {1, 2, kE});
    if (out.num_elements() != 2 * kE) {
      Wrong("Sequence: a step's output is not (1, 2, E)");
    } else {
      CheckCausal(version, all, at, Tensor::FromBytes(DType::kFloat32, {2, kE}, out.data()),
                  "Sequence");
    }
  }
  return grpc::StatusCode::OK;
}

}  // namespace attention::churn_test
