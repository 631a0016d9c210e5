#include "tests/model_lifecycle/churn/churn_calls.h"

#include <httplib.h>

#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/fixture/model_versions_fixture.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_util.h"
#include "tests/model_lifecycle/churn/churn_wire.h"

namespace attention::churn_test {

using model_versions_test::Reference;
using testing::FromProto;
using testing::RandomTensor;
using testing::ToProto;

const char* KindName(Kind kind) {
  static const char* const kNames[] = {"Infer",         "InferStream", "Session",
                                       "SessionStream", "ModelInfer",  "ModelStreamInfer",
                                       "Sequence",      "Rest",        "Metadata"};
  return kNames[static_cast<int>(kind)];
}

bool Allowed(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return true;
    default:
      return false;
  }
}

ChurnCalls::ChurnCalls(std::shared_ptr<grpc::Channel> channel, int http_port)
    : channel_(std::move(channel)),
      http_port_(http_port),
      attention_(v1::AttentionService::NewStub(channel_)),
      sessions_(v1::SessionService::NewStub(channel_)),
      oip_(inference::GRPCInferenceService::NewStub(channel_)) {}

void ChurnCalls::AddVersion(int64_t version, std::shared_ptr<const MhaModel> model) {
  absl::MutexLock lock(&mu_);
  models_[version] = std::move(model);
}

std::shared_ptr<const MhaModel> ChurnCalls::Model(int64_t version) const {
  absl::MutexLock lock(&mu_);
  const auto it = models_.find(version);
  return it == models_.end() ? nullptr : it->second;
}

void ChurnCalls::Wrong(const std::string& what) {
  ADD_FAILURE() << what;
  absl::MutexLock lock(&mu_);
  ++wrong_;
}

void ChurnCalls::CheckStateless(int64_t version, const Tensor& query, const Tensor& output,
                                const char* what) {
  const auto model = Model(version);
  if (model == nullptr) return Wrong(absl::StrCat(what, ": answered by unknown version ", version));
  const double error = model_versions_test::Error(model, query, output);
  if (!(error < kTolerance)) {
    Wrong(absl::StrCat(what, ": version ", version, " answer off its reference by ", error));
  }
}

void ChurnCalls::CheckCausal(int64_t version, const Tensor& all, int64_t from, const Tensor& got,
                             const char* what) {
  const auto model = Model(version);
  if (model == nullptr) return Wrong(absl::StrCat(what, ": answered by unknown version ", version));
  MhaInputs in;
  in.query = all.view();
  in.is_causal = true;
  const MhaOutputs want = Reference(model, in);
  const int64_t n = NumElements(got.shape());
  if (n == 0 || n % kE != 0 || from * kE + n > want.output.num_elements()) {
    return Wrong(absl::StrCat(what, ": ", n, " values for rows from ", from));
  }
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(got.as<float>()[i] -
                                                         want.output.as<float>()[from * kE + i])));
  }
  if (!(worst < kTolerance)) {
    Wrong(absl::StrCat(what, ": version ", version, " rows from ", from, " off by ", worst));
  }
}

grpc::StatusCode ChurnCalls::Run(Kind kind, std::mt19937& rng) {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  switch (kind) {
    case Kind::kInfer:
      code = Infer(rng);
      break;
    case Kind::kInferStream:
      code = InferStream(rng);
      break;
    case Kind::kSession:
      code = Session(rng, /*stream=*/false);
      break;
    case Kind::kSessionStream:
      code = Session(rng, /*stream=*/true);
      break;
    case Kind::kModelInfer:
      code = ModelInfer(rng, /*stream=*/false);
      break;
    case Kind::kModelStreamInfer:
      code = ModelInfer(rng, /*stream=*/true);
      break;
    case Kind::kSequence:
      code = Sequence(rng);
      break;
    case Kind::kRest:
      code = Rest(rng);
      break;
    case Kind::kMetadata:
      code = Metadata(rng);
      break;
    case Kind::kCount:
      break;
  }
  EXPECT_TRUE(Allowed(code)) << KindName(kind) << " got code " << code;
  absl::MutexLock lock(&mu_);
  ++counts_[{static_cast<int>(kind), static_cast<int>(code)}];
  return code;
}

grpc::StatusCode ChurnCalls::Infer(std::mt19937& rng) {
  const Tensor query = Query(rng);
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::InferRequest request;
  request.set_model("m");
  ToProto(query, request.mutable_query());
  v1::InferResponse response;
  const grpc::Status status = attention_->Infer(&context, request, &response);
  if (status.ok())
    CheckStateless(response.model_version(), query, FromProto(response.output()), "Infer");
  return status.error_code();
}

grpc::StatusCode ChurnCalls::InferStream(std::mt19937& rng) {
  grpc::ClientContext context;
  SetDeadline(&context);
  auto stream = attention_->InferStream(&context);
  std::vector<Tensor> queries;
  for (int i = 0; i < 3; ++i) {
    queries.push_back(Query(rng));
    v1::InferRequest request;
    request.set_model("m");
    request.set_request_id(std::to_string(i));
    ToProto(queries.back(), request.mutable_query());
    if (!stream->Write(request)) break;
  }
  stream->WritesDone();
  grpc::StatusCode worst = grpc::StatusCode::OK;
  v1::InferResponse response;
  while (stream->Read(&response)) {
    const int i = std::atoi(response.request_id().c_str());
    if (response.has_error()) {
      const auto code = static_cast<grpc::StatusCode>(response.error().code());
      EXPECT_TRUE(Allowed(code)) << "InferStream request: " << response.error().message();
      worst = code;
    } else if (i >= 0 && i < static_cast<int>(queries.size())) {
      CheckStateless(response.model_version(), queries[i], FromProto(response.output()),
                     "InferStream");
    }
  }
  const grpc::Status status = stream->Finish();
  return status.ok() ? worst : status.error_code();
}

grpc::StatusCode ChurnCalls::ModelInfer(std::mt19937& rng, bool stream) {
  const Tensor query = Query(rng);
  const inference::ModelInferRequest request = OipRequest(query);
  if (!stream) {
    grpc::ClientContext context;
    SetDeadline(&context);
    inference::ModelInferResponse response;
    const grpc::Status status = oip_->ModelInfer(&context, request, &response);
    if (status.ok()) {
      CheckStateless(VersionOf(response.model_version()), query, OipOutput(response, query.shape()),
                     "ModelInfer");
    }
    return status.error_code();
  }
  grpc::ClientContext context;
  SetDeadline(&context);
  auto calls = oip_->ModelStreamInfer(&context);
  const bool written = calls->Write(request) && calls->Write(request);
  calls->WritesDone();
  grpc::StatusCode code = grpc::StatusCode::OK;
  inference::ModelStreamInferResponse response;
  while (calls->Read(&response)) {
    if (!response.error_message().empty()) {
      code = grpc::StatusCode::UNAVAILABLE;  // The message says which; the code is not sent.
      const std::string& m = response.error_message();
      EXPECT_TRUE(
          m.find("unloaded") != std::string::npos || m.find("not served") != std::string::npos ||
          m.find("shutting down") != std::string::npos ||
          m.find("not ready") != std::string::npos || m.find("no version") != std::string::npos)
          << "ModelStreamInfer: " << m;
      continue;
    }
    const auto& infer = response.infer_response();
    CheckStateless(VersionOf(infer.model_version()), query, OipOutput(infer, query.shape()),
                   "ModelStreamInfer");
  }
  const grpc::Status status = calls->Finish();
  (void)written;
  return status.ok() ? code : status.error_code();
}

grpc::StatusCode ChurnCalls::Rest(std::mt19937& rng) {
  const Tensor query = Query(rng);
  nlohmann::json body = {
      {"inputs",
       {{{"name", "query"},
         {"datatype", "FP32"},
         {"shape", query.shape()},
         {"data",
          std::vector<float>(query.as<float>(), query.as<float>() + query.num_elements())}}}}};
  httplib::Client client("127.0.0.1", http_port_);
  client.set_read_timeout(60, 0);
  auto result = client.Post("/v2/models/m/infer", body.dump(), "application/json");
  if (!result) return grpc::StatusCode::UNAVAILABLE;  // Refused: the server has stopped.
  switch (result->status) {
    case 200:
      break;
    case 404:
      return grpc::StatusCode::NOT_FOUND;
    case 503:
      return grpc::StatusCode::UNAVAILABLE;
    default:
      ADD_FAILURE() << "REST infer: " << result->status << " " << result->body.substr(0, 300);
      return grpc::StatusCode::UNKNOWN;
  }
  const nlohmann::json reply = nlohmann::json::parse(result->body, nullptr, false);
  if (reply.is_discarded() || !reply.contains("outputs")) {
    Wrong("REST infer: unparsable reply " + result->body.substr(0, 200));
    return grpc::StatusCode::OK;
  }
  const std::vector<float> data = reply["outputs"][0]["data"].get<std::vector<float>>();
  const Tensor out = data.size() == static_cast<size_t>(query.num_elements())
                         ? Tensor::FromBytes(DType::kFloat32, query.shape(), data.data())
                         : Tensor(DType::kFloat32, {0});
  CheckStateless(VersionOf(reply.value("model_version", "")), query, out, "REST infer");
  return grpc::StatusCode::OK;
}

grpc::StatusCode ChurnCalls::Metadata(std::mt19937& rng) {
  grpc::ClientContext context;
  SetDeadline(&context);
  grpc::Status status;
  switch (rng() % 4) {
    case 0: {
      v1::ListModelsResponse response;
      status = attention_->ListModels(&context, v1::ListModelsRequest(), &response);
      break;
    }
    case 1: {
      v1::GetModelRequest request;
      request.set_name("m");
      v1::ModelInfo response;
      status = attention_->GetModel(&context, request, &response);
      break;
    }
    case 2: {
      inference::ModelMetadataRequest request;
      request.set_name("m");
      inference::ModelMetadataResponse response;
      status = oip_->ModelMetadata(&context, request, &response);
      break;
    }
    default: {
      inference::RepositoryIndexRequest request;
      inference::RepositoryIndexResponse response;
      status = oip_->RepositoryIndex(&context, request, &response);
    }
  }
  return status.error_code();
}

int64_t ChurnCalls::Count(Kind kind, grpc::StatusCode code) const {
  absl::MutexLock lock(&mu_);
  const auto it = counts_.find({static_cast<int>(kind), static_cast<int>(code)});
  return it == counts_.end() ? 0 : it->second;
}

std::string ChurnCalls::Summary() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [key, n] : counts_) {
    absl::StrAppend(&out, KindName(static_cast<Kind>(key.first)), " code ", key.second, ": ", n,
                    "; ");
  }
  return absl::StrCat(out, "wrong: ", wrong_);
}

int64_t ChurnCalls::wrong() const {
  absl::MutexLock lock(&mu_);
  return wrong_;
}

}  // namespace attention::churn_test
