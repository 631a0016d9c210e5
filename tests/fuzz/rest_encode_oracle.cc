// The REST infer response encoder as it was before it could size a response
// without building it: the oracle of rest_encode's byte-identical output.
// Kept as it was, but for its names.
#include "tests/fuzz/rest_encode_oracle.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/dtype.h"
#include "nlohmann/json.hpp"

namespace attention::fuzz {
namespace {

using server::RestBody;
using server::RestInferRequest;

// Bytes per element of a datatype the server takes, or 0.
size_t ElementBytes(absl::string_view datatype) {
  if (datatype == "FP32") return 4;
  if (datatype == "FP16" || datatype == "BF16") return 2;
  if (datatype == "BOOL") return 1;
  return 0;
}

// Appends `value` as JSON (NaN and infinities by their JavaScript names).
void AppendFloat(float value, std::string* out) {
  if (std::isnan(value)) {
    out->append("NaN");
  } else if (std::isinf(value)) {
    out->append(value > 0 ? "Infinity" : "-Infinity");
  } else {
    char buf[32];
    const auto end = std::to_chars(buf, buf + sizeof(buf), value).ptr;
    out->append(buf, end);
  }
}

void AppendData(const std::string& datatype, const std::string& bytes, std::string* out) {
  out->push_back('[');
  const size_t size = ElementBytes(datatype);
  const size_t n = size == 0 ? 0 : bytes.size() / size;
  out->reserve(out->size() + n * 12);
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out->push_back(',');
    if (datatype == "BOOL") {
      out->append(bytes[i] != 0 ? "true" : "false");
      continue;
    }
    float f = 0;
    if (datatype == "FP32") {
      std::memcpy(&f, bytes.data() + 4 * i, 4);
    } else {
      uint16_t h = 0;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      f = datatype == "FP16" ? HalfToFloat(h) : BFloat16ToFloat(h);
    }
    AppendFloat(f, out);
  }
  out->push_back(']');
}

std::string Quoted(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string ParameterJson(const inference::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kBoolParam:
      return p.bool_param() ? "true" : "false";
    case inference::InferParameter::kInt64Param:
      return absl::StrCat(p.int64_param());
    case inference::InferParameter::kUint64Param:
      return absl::StrCat(p.uint64_param());
    case inference::InferParameter::kDoubleParam:
      return nlohmann::json(p.double_param()).dump();
    case inference::InferParameter::kStringParam:
      return Quoted(p.string_param());
    default:
      return "null";
  }
}

}  // namespace

RestBody EncodeRestInferAsBefore(inference::ModelInferResponse& response,
                                 const RestInferRequest& asked) {
  RestBody body;
  std::string& json = body.bytes;
  std::string binary;
  bool any_binary = false;
  absl::StrAppend(&json, "{\"model_name\":", Quoted(response.model_name()),
                  ",\"model_version\":", Quoted(response.model_version()));
  if (!response.id().empty()) absl::StrAppend(&json, ",\"id\":", Quoted(response.id()));
  if (!response.parameters().empty()) {
    json.append(",\"parameters\":{");
    bool first = true;
    for (const auto& [name, p] : response.parameters()) {
      absl::StrAppend(&json, first ? "" : ",", Quoted(name), ":", ParameterJson(p));
      first = false;
    }
    json.push_back('}');
  }
  json.append(",\"outputs\":[");
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& o = response.outputs(i);
    std::string& bytes = *response.mutable_raw_output_contents(i);
    absl::StrAppend(&json, i > 0 ? "," : "", "{\"name\":", Quoted(o.name()),
                    ",\"datatype\":", Quoted(o.datatype()), ",\"shape\":[",
                    absl::StrJoin(o.shape(), ","), "]");
    bool as_binary = asked.all_binary;
    for (const std::string& name : asked.binary_outputs) as_binary |= name == o.name();
    if (as_binary) {
      absl::StrAppend(&json, ",\"parameters\":{\"binary_data_size\":", bytes.size(), "}}");
      binary.append(bytes);
      any_binary = true;
    } else {
      json.append(",\"data\":");
      AppendData(o.datatype(), bytes, &json);
      json.push_back('}');
    }
    std::string().swap(bytes);
  }
  json.append("]}");
  if (any_binary) {
    body.header_length = json.size();
    json.append(binary);
  }
  return body;
}

}  // namespace attention::fuzz
