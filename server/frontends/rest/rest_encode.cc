#include "server/frontends/rest/rest_encode.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/dtype.h"
#include "nlohmann/json.hpp"

namespace attention::server {
namespace {

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

// The most bytes AppendFloat writes: "-1.17549435e-38" (9 significant
// digits, the most a float's shortest form needs, with a two-digit exponent).
constexpr size_t kMaxFloatBytes = 15;

// Writes the JSON into a string.
struct Writer {
  std::string* out;
  void Add(absl::string_view s) { out->append(s.data(), s.size()); }
  void Float(float f) { AppendFloat(f, out); }
};

// Counts what Writer would write: exactly, or with every float at its
// longest (`bound`).
struct Counter {
  bool bound = false;
  size_t bytes = 0;
  void Add(absl::string_view s) { bytes += s.size(); }
  void Float(float f) {
    if (bound) {
      bytes += kMaxFloatBytes;
      return;
    }
    std::string s;
    AppendFloat(f, &s);  // Short: within std::string's inline buffer.
    bytes += s.size();
  }
};

template <typename Out>
void WriteData(const std::string& datatype, const std::string& bytes, Out& out) {
  out.Add("[");
  const size_t size = ElementBytes(datatype);
  const size_t n = size == 0 ? 0 : bytes.size() / size;
  // The type once, not per element.
  const bool is_bool = datatype == "BOOL", fp32 = datatype == "FP32", fp16 = datatype == "FP16";
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out.Add(",");
    if (is_bool) {
      out.Add(bytes[i] != 0 ? "true" : "false");
      continue;
    }
    float f = 0;
    if (fp32) {
      std::memcpy(&f, bytes.data() + 4 * i, 4);
    } else {
      uint16_t h = 0;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      f = fp16 ? HalfToFloat(h) : BFloat16ToFloat(h);
    }
    out.Float(f);
  }
  out.Add("]");
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

bool AsBinary(const inference::ModelInferResponse::InferOutputTensor& o,
              const RestInferRequest& asked) {
  bool as_binary = asked.all_binary;
  for (const std::string& name : asked.binary_outputs) as_binary |= name == o.name();
  return as_binary;
}

// What follows the JSON part: binary outputs' bytes.
struct Binary {
  bool any = false;
  size_t bytes = 0;
};

// Writes the response's JSON part (binary outputs' bytes go after it).
template <typename Out>
Binary WriteJson(const inference::ModelInferResponse& response, const RestInferRequest& asked,
                 Out& out) {
  Binary binary;
  out.Add(absl::StrCat("{\"model_name\":", Quoted(response.model_name()),
                       ",\"model_version\":", Quoted(response.model_version())));
  if (!response.id().empty()) out.Add(absl::StrCat(",\"id\":", Quoted(response.id())));
  if (!response.parameters().empty()) {
    out.Add(",\"parameters\":{");
    bool first = true;
    for (const auto& [name, p] : response.parameters()) {
      out.Add(absl::StrCat(first ? "" : ",", Quoted(name), ":", ParameterJson(p)));
      first = false;
    }
    out.Add("}");
  }
  out.Add(",\"outputs\":[");
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& o = response.outputs(i);
    const std::string& bytes = response.raw_output_contents(i);
    out.Add(absl::StrCat(i > 0 ? "," : "", "{\"name\":", Quoted(o.name()), ",\"datatype\":",
                         Quoted(o.datatype()), ",\"shape\":[", absl::StrJoin(o.shape(), ","), "]"));
    if (AsBinary(o, asked)) {
      out.Add(absl::StrCat(",\"parameters\":{\"binary_data_size\":", bytes.size(), "}}"));
      binary.any = true;
      binary.bytes += bytes.size();
    } else {
      out.Add(",\"data\":");
      WriteData(o.datatype(), bytes, out);
      out.Add("}");
    }
  }
  out.Add("]}");
  return binary;
}

}  // namespace

size_t RestInferEncodedSize(const inference::ModelInferResponse& response,
                            const RestInferRequest& asked, bool bound) {
  Counter counter{bound};
  const size_t binary = WriteJson(response, asked, counter).bytes;
  return counter.bytes + binary;
}

RestBody EncodeRestInfer(inference::ModelInferResponse& response, const RestInferRequest& asked,
                         size_t size) {
  RestBody body;
  std::string& json = body.bytes;
  json.reserve(size != 0 ? size : RestInferEncodedSize(response, asked, /*bound=*/true));
  Writer writer{&json};
  // The outputs' bytes are released as they are written.
  if (WriteJson(response, asked, writer).any) body.header_length = json.size();
  for (int i = 0; i < response.outputs_size(); ++i) {
    std::string& bytes = *response.mutable_raw_output_contents(i);
    if (AsBinary(response.outputs(i), asked)) json.append(bytes);
    std::string().swap(bytes);
  }
  return body;
}

absl::StatusOr<RestBody> EncodeRestInferWithin(inference::ModelInferResponse& response,
                                               const RestInferRequest& asked, size_t max_bytes) {
  size_t size = 0;  // Unknown, but within max_bytes.
  if (RestInferEncodedSize(response, asked, /*bound=*/true) > max_bytes) {
    size = RestInferEncodedSize(response, asked, /*bound=*/false);
    if (size > max_bytes) {
      bool any_binary = false;
      for (const auto& o : response.outputs()) any_binary |= AsBinary(o, asked);
      return absl::ResourceExhaustedError(
          absl::StrCat("response: ", size, " bytes", any_binary ? "" : " as JSON",
                       ", larger than the server's limit of ", max_bytes,
                       " bytes (--max_message_bytes); ask for binary outputs "
                       "(parameters.binary_data_output)"));
    }
  }
  return EncodeRestInfer(response, asked, size);
}

}  // namespace attention::server
