// RestFrontend's GET routes and the repository's listings (the rest of
// the class is in rest_frontend.cc).
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/frontends/rest/rest_frontend.h"
#include "server/frontends/rest/rest_json.h"
#include "server/frontends/rest/rest_routes.h"

namespace attention::server {

HttpResponse RestFrontend::Get(const HttpRequest& req) {
  InferenceProtocol* p = protocol_;
  HttpResponse res;
  const CallRef call = CallOfRequest(req, Method::kModelInfer);
  if (req.path == "/v2/health/live") {
    ReplyProbe(res, p->AuthenticateProbe(*call), true);
    return res;
  }
  if (req.path == "/v2/health/ready") {
    ReplyProbe(res, p->AuthenticateProbe(*call), p->ServerReady());
    return res;
  }
  if (req.path == "/v2") {
    const absl::Status allowed = p->AuthenticateProbe(*call);
    if (!allowed.ok()) return ErrorResponse(allowed);
    inference::ServerMetadataResponse metadata;
    p->ServerMetadata(&metadata);
    ReplyJson(res, ProtoToJson(metadata).dump());
    return res;
  }
  if (req.path == "/v2/models") return Models(req);
  if (req.path == "/") {  // A pointer for curl localhost:8000/ (static: no auth).
    ReplyJson(res, nlohmann::json{{"name", "attention-server"},
                                  {"protocol", "KServe v2 REST (docs/api/rest.md)"},
                                  {"endpoints",
                                   {"GET /v2", "GET /v2/health/live", "GET /v2/health/ready",
                                    "GET /v2/models", "GET /v2/models/{model}",
                                    "POST /v2/models/{model}/infer", "POST /v2/repository/index"}},
                                  {"metrics", MetricsPointer()}}
                       .dump());
    return res;
  }
  if (req.path == "/metrics") {
    return ErrorResponse(absl::NotFoundError(
        absl::StrCat("no endpoint GET /metrics on the REST port: ", MetricsPointer())));
  }
  if (IsPostEndpoint(req.path)) return WrongMethod(req, "POST");
  std::optional<ModelPath> model = ParseModelPath(req.path);
  if (req.path == "/v2/models/stats") model = ModelPath{"", "", "stats"};
  if (!model.has_value()) {
    return ErrorResponse(absl::NotFoundError(
        absl::StrCat("no endpoint ", req.method, " ", req.path.substr(0, 200))));
  }
  absl::Status status;
  if (model->action == "stats") {
    inference::ModelStatisticsRequest request;
    request.set_name(model->name);
    request.set_version(model->version);
    inference::ModelStatisticsResponse response;
    status = p->ModelStatistics(*call, request, &response);
    if (status.ok()) ReplyJson(res, ProtoToJson(response).dump());
  } else if (model->action == "ready") {
    bool ready = false;
    status = p->ModelReady(*call, model->name, model->version, &ready);
    ReplyProbe(res, status, ready);
    return res;
  } else if (model->action == "config") {
    inference::ModelConfigRequest request;
    request.set_name(model->name);
    request.set_version(model->version);
    inference::ModelConfigResponse response;
    status = p->ModelConfig(*call, request, &response);
    if (status.ok()) ReplyJson(res, ProtoToJson(response.config()).dump());
  } else {
    inference::ModelMetadataRequest request;
    request.set_name(model->name);
    request.set_version(model->version);
    inference::ModelMetadataResponse response;
    status = p->ModelMetadata(*call, request, &response);
    if (status.ok()) ReplyJson(res, ProtoToJson(response).dump());
  }
  return status.ok() ? res : ErrorResponse(status);
}

std::string RestFrontend::MetricsPointer() const {
  if (options_.metrics_port <= 0) {
    return "Prometheus metrics are off on this server (--metrics_port=0)";
  }
  return absl::StrCat("Prometheus metrics are served on the metrics port, ", options_.metrics_port,
                      " (--metrics_port): GET http://HOST:", options_.metrics_port, "/metrics");
}

HttpResponse RestFrontend::Index(const HttpRequest& req) {
  const absl::StatusOr<bool> ready = RepositoryIndexReady(req.body);
  if (!ready.ok()) return ErrorResponse(ready.status());
  inference::RepositoryIndexRequest request;
  request.set_ready(*ready);
  inference::RepositoryIndexResponse response;
  const absl::Status status =
      protocol_->RepositoryIndex(*CallOfRequest(req, Method::kModelInfer), request, &response);
  if (!status.ok()) return ErrorResponse(status);
  nlohmann::json models = nlohmann::json::array();
  for (const auto& m : response.models()) models.push_back(ProtoToJson(m));
  HttpResponse res;
  ReplyJson(res, models.dump());
  return res;
}

HttpResponse RestFrontend::Models(const HttpRequest& req) {
  inference::RepositoryIndexRequest request;
  inference::RepositoryIndexResponse index;
  const absl::Status status =
      protocol_->RepositoryIndex(*CallOfRequest(req, Method::kModelInfer), request, &index);
  if (!status.ok()) return ErrorResponse(status);
  // The index has a line per version, by model: one entry per model.
  nlohmann::json models = nlohmann::json::array();
  for (const auto& v : index.models()) {
    if (models.empty() || models.back()["name"] != v.name()) {
      models.push_back(
          {{"name", v.name()}, {"state", "UNAVAILABLE"}, {"versions", nlohmann::json::array()}});
    }
    nlohmann::json& m = models.back();
    if (!v.version().empty()) {
      nlohmann::json version = {{"version", v.version()}, {"state", v.state()}};
      if (!v.reason().empty()) version["reason"] = v.reason();
      m["versions"].push_back(std::move(version));
    }
    if (v.state() == "READY") {
      m["state"] = "READY";
      m.erase("reason");
    } else if (m["state"] != "READY" && !v.reason().empty()) {
      m["reason"] = v.reason();  // The newest version's, as the index orders them.
    }
  }
  HttpResponse res;
  ReplyJson(res, nlohmann::json{{"models", std::move(models)}}.dump());
  return res;
}

}  // namespace attention::server
