#include "server/frontends/rest/rest_json.h"

#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "proto/codec/status_codes.h"
#include "server/frontends/rest/rest_json_reader.h"

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

namespace {

// The last value of `key` in the JSON object `body` (unset when absent);
// `error` for a body that is not a JSON object within the depth limit.
absl::StatusOr<std::optional<JsonReader>> LastMember(const std::string& body, absl::string_view key,
                                                     absl::string_view error) {
  if (body.empty()) return std::optional<JsonReader>();
  const absl::Status valid =
      JsonReader::Validate(body, kRepositoryBodyMaxDepth, /*non_finite=*/false);
  if (!valid.ok())
    return absl::InvalidArgumentError(absl::StrCat(error, " (", valid.message(), ")"));
  JsonReader r(body);
  if (r.Peek() != JsonReader::Kind::kObject) return absl::InvalidArgumentError(error);
  std::optional<JsonReader> last;
  r.Enter();
  std::string name;
  while (r.NextKey(&name)) {
    if (name == key) {
      r.Peek();
      last = r;
    }
    r.Skip();
  }
  return last;
}

}  // namespace

absl::StatusOr<int> RepositoryControlParameters(const std::string& body) {
  constexpr absl::string_view kError = "request body: expected {} or {\"parameters\": {...}}";
  absl::StatusOr<std::optional<JsonReader>> parameters = LastMember(body, "parameters", kError);
  if (!parameters.ok()) return parameters.status();
  if (!*parameters) return 0;
  JsonReader& r = **parameters;
  if (r.Peek() != JsonReader::Kind::kObject) return absl::InvalidArgumentError(kError);
  // Distinct names, as an object holds them.
  absl::flat_hash_set<std::string> names;
  r.Enter();
  std::string name;
  while (r.NextKey(&name)) {
    names.insert(name);
    r.Skip();
  }
  return static_cast<int>(names.size());
}

absl::StatusOr<bool> RepositoryIndexReady(const std::string& body) {
  constexpr absl::string_view kError = "request body: expected {} or {\"ready\": true|false}";
  absl::StatusOr<std::optional<JsonReader>> ready = LastMember(body, "ready", kError);
  if (!ready.ok()) return ready.status();
  if (!*ready) return false;
  if ((*ready)->Peek() != JsonReader::Kind::kBool) return absl::InvalidArgumentError(kError);
  return (*ready)->Bool();
}

}  // namespace attention::server
