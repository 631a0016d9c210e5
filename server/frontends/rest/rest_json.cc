#include "server/frontends/rest/rest_json.h"

#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "proto/codec/status_codes.h"

namespace attention::server {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// One value of `field` (element `index` when repeated, else -1).
nlohmann::json FieldValue(const Message& m, const Reflection& r, const FieldDescriptor* f,
                          int index) {
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return rep ? r.GetRepeatedInt32(m, f, index) : r.GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64:
      return rep ? r.GetRepeatedInt64(m, f, index) : r.GetInt64(m, f);
    case FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r.GetRepeatedUInt32(m, f, index) : r.GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT64:
      return rep ? r.GetRepeatedUInt64(m, f, index) : r.GetUInt64(m, f);
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return rep ? r.GetRepeatedDouble(m, f, index) : r.GetDouble(m, f);
    case FieldDescriptor::CPPTYPE_FLOAT:
      return rep ? r.GetRepeatedFloat(m, f, index) : r.GetFloat(m, f);
    case FieldDescriptor::CPPTYPE_BOOL:
      return rep ? r.GetRepeatedBool(m, f, index) : r.GetBool(m, f);
    case FieldDescriptor::CPPTYPE_ENUM:
      return (rep ? r.GetRepeatedEnum(m, f, index) : r.GetEnum(m, f))->name();
    case FieldDescriptor::CPPTYPE_STRING:
      return rep ? r.GetRepeatedString(m, f, index) : r.GetString(m, f);
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return ProtoToJson(rep ? r.GetRepeatedMessage(m, f, index) : r.GetMessage(m, f));
  }
  return nullptr;
}

// A map entry's key as a JSON object key.
std::string MapKey(const Message& entry) {
  const nlohmann::json key = ProtoToJson(entry)["key"];
  return key.is_string() ? key.get<std::string>() : key.dump();
}

}  // namespace

nlohmann::json ProtoToJson(const Message& message) {
  nlohmann::json out = nlohmann::json::object();
  const Reflection& r = *message.GetReflection();
  const auto& descriptor = *message.GetDescriptor();
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const FieldDescriptor* f = descriptor.field(i);
    if (f->is_map()) {
      nlohmann::json map = nlohmann::json::object();
      for (int k = 0; k < r.FieldSize(message, f); ++k) {
        const Message& entry = r.GetRepeatedMessage(message, f, k);
        map[MapKey(entry)] = ProtoToJson(entry)["value"];
      }
      out[f->name()] = std::move(map);
    } else if (f->is_repeated()) {
      nlohmann::json list = nlohmann::json::array();
      for (int k = 0; k < r.FieldSize(message, f); ++k) {
        list.push_back(FieldValue(message, r, f, k));
      }
      out[f->name()] = std::move(list);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE || f->containing_oneof()) {
      // Sub-messages and oneof members only when set (Triton's tools read a
      // config's scheduling choice by which member is present).
      if (r.HasField(message, f)) out[f->name()] = FieldValue(message, r, f, -1);
    } else {
      out[f->name()] = FieldValue(message, r, f, -1);
    }
  }
  return out;
}

std::string ErrorBody(const absl::Status& status) {
  std::string message(status.message());
  if (message.empty()) message = std::string(wire::StatusCodeName(status.code()));
  return nlohmann::json{{"error", message}}.dump(-1, ' ', false,
                                                 nlohmann::json::error_handler_t::replace);
}

int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kUnknown:
      return 500;
    default:  // INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE, ALREADY_EXISTS, ...
      return 400;
  }
}

absl::StatusOr<int> RepositoryControlParameters(const std::string& body) {
  const nlohmann::json json =
      body.empty() ? nlohmann::json::object() : nlohmann::json::parse(body, nullptr, false);
  if (!json.is_object() || (json.contains("parameters") && !json["parameters"].is_object())) {
    return absl::InvalidArgumentError("request body: expected {} or {\"parameters\": {...}}");
  }
  return json.contains("parameters") ? static_cast<int>(json["parameters"].size()) : 0;
}

}  // namespace attention::server
