#include "server/frontends/rest/rest_codec.h"

#include <array>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/frontends/rest/rest_json_reader.h"
#include "server/requests/identifiers.h"

namespace attention::server {
namespace {

using Kind = JsonReader::Kind;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status Expected(absl::string_view field, absl::string_view expected, Kind got) {
  return Invalid(field, absl::StrCat("expected ", expected, ", got ", JsonReader::KindName(got)));
}

// Bytes per element of a datatype the server takes, or 0.
size_t ElementBytes(absl::string_view datatype) {
  if (datatype == "FP32") return 4;
  if (datatype == "FP16" || datatype == "BF16") return 2;
  if (datatype == "BOOL") return 1;
  return 0;
}

// The JSON parameter value at `r` as the protocol's typed parameter.
absl::Status ToParameter(absl::string_view field, JsonReader& r, inference::InferParameter* p) {
  switch (const Kind kind = r.Peek()) {
    case Kind::kBool:
      p->set_bool_param(r.Bool());
      return absl::OkStatus();
    case Kind::kInteger:
      p->set_int64_param(r.Integer());
      return absl::OkStatus();
    case Kind::kUnsigned:
      p->set_uint64_param(r.Unsigned());
      return absl::OkStatus();
    case Kind::kDouble:
      p->set_double_param(r.Double());
      return absl::OkStatus();
    case Kind::kString:
      p->set_string_param(r.String());
      return absl::OkStatus();
    default:
      return Expected(field, "a boolean, number or string", kind);
  }
}

// Counts the leaves of the data at `r` (nested arrays; a value that is not
// an array is one leaf), stopping once past `limit`.
absl::Status CountLeaves(JsonReader& r, const std::string& field, int depth, int64_t limit,
                         int64_t* n) {
  if (!r.AtArray()) {
    r.Skip();
    ++*n;
    return absl::OkStatus();
  }
  if (depth > 32) return Invalid(field, "arrays nested more than 32 deep");
  r.Enter();
  while (r.NextElement()) {
    absl::Status s = CountLeaves(r, field, depth + 1, limit, n);
    if (!s.ok() || *n > limit) return s;
  }
  return absl::OkStatus();
}

// JavaScript's NaN, Infinity and -Infinity (as Python's json and Triton's
// parser write them, and as responses carry them; the reader reads them, and
// quoted ones, as strings).
bool NonFinite(const std::string& s, double* d) {
  if (s == "NaN") {
    *d = std::numeric_limits<double>::quiet_NaN();
  } else if (s == "Infinity") {
    *d = std::numeric_limits<double>::infinity();
  } else if (s == "-Infinity") {
    *d = -std::numeric_limits<double>::infinity();
  } else {
    return false;
  }
  return true;
}

// Writes the leaves at `r` (CountLeaves counted them) into `out` from *i on:
// FP32 (4 bytes each) or BOOL (`is_bool`, 1 byte each).
absl::Status WriteLeaves(JsonReader& r, const std::string& field, bool is_bool, char* out,
                         int64_t* i) {
  double d = 0;
  if (!is_bool && r.NumberAsDouble(&d)) {  // The common case first.
    const float f = static_cast<float>(d);
    std::memcpy(out + *i * 4, &f, 4);
    ++*i;
    return absl::OkStatus();
  }
  const Kind kind = r.Peek();
  if (kind == Kind::kArray) {
    r.Enter();
    while (r.NextElement()) {
      absl::Status s = WriteLeaves(r, field, is_bool, out, i);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (is_bool) {
    int64_t v = -1;
    if (kind == Kind::kBool) {
      v = r.Bool() ? 1 : 0;
    } else if (kind == Kind::kInteger) {
      v = r.Integer();
    }
    if (v != 0 && v != 1) {
      return Expected(absl::StrCat(field, "[", *i, "]"), "true or false (BOOL)", kind);
    }
    out[*i] = static_cast<char>(v);
  } else {
    if (kind != Kind::kString || !NonFinite(r.String(), &d)) {
      return Expected(absl::StrCat(field, "[", *i, "]"), "a number (FP32)", kind);
    }
    const float f = static_cast<float>(d);
    std::memcpy(out + *i * 4, &f, 4);
  }
  ++*i;
  return absl::OkStatus();
}

// The first value of each of `keys` in the object at `r` (consumed), as
// readers at those values (unset when absent): a member may come in any
// order ("data" before "shape"), and the first of a repeated key counts.
template <size_t N>
void FindMembers(JsonReader& r, const std::array<absl::string_view, N>& keys,
                 std::array<std::optional<JsonReader>, N>* found) {
  r.Enter();
  std::string key;
  while (r.NextKey(&key)) {
    for (size_t k = 0; k < N; ++k) {
      if (key == keys[k] && !(*found)[k]) {
        r.Peek();
        (*found)[k] = r;
        break;
      }
    }
    r.Skip();
  }
}

// Decodes input `i` (at `r`) into the request, taking binary data from
// *binary.
absl::Status DecodeInput(JsonReader& r, int i, absl::string_view* binary,
                         inference::ModelInferRequest* request) {
  std::string field = absl::StrCat("inputs[", i, "]");
  if (const Kind kind = r.Peek(); kind != Kind::kObject) {
    return Expected(field, "an object", kind);
  }
  enum { kName, kDatatype, kShape, kData, kParameters };
  std::array<std::optional<JsonReader>, 5> at;
  FindMembers<5>(r, {"name", "datatype", "shape", "data", "parameters"}, &at);
  if (!at[kName] || at[kName]->Peek() != Kind::kString) {
    return Invalid(absl::StrCat(field, ".name"), "expected a string");
  }
  const std::string name = at[kName]->String();
  field = absl::StrCat(field, " ('", Shown(name), "')");
  if (!at[kDatatype] || at[kDatatype]->Peek() != Kind::kString) {
    return Invalid(absl::StrCat(field, ".datatype"), "expected a string");
  }
  const std::string datatype = at[kDatatype]->String();
  const size_t bytes_per = ElementBytes(datatype);
  if (bytes_per == 0) {
    return Invalid(absl::StrCat(field, ".datatype"),
                   absl::StrCat("expected FP32, FP16, BF16 or BOOL, got '", Shown(datatype), "'"));
  }
  if (!at[kShape] || at[kShape]->Peek() != Kind::kArray) {
    return Invalid(absl::StrCat(field, ".shape"), "expected an array of integers");
  }
  auto* in = request->add_inputs();
  in->set_name(name);
  in->set_datatype(datatype);
  // Elements the shape holds, capped well below any overflow.
  constexpr int64_t kCap = int64_t{1} << 40;
  int64_t elements = 1;
  JsonReader& shape = *at[kShape];
  shape.Enter();
  while (shape.NextElement()) {
    const int64_t v = shape.Peek() == Kind::kInteger ? shape.Integer() : -1;
    if (v < 0) return Invalid(absl::StrCat(field, ".shape"), "expected non-negative integers");
    in->add_shape(v);
    elements = (v != 0 && elements > kCap / v) ? kCap + 1 : elements * v;
  }
  const int64_t want_bytes = elements > kCap ? -1 : elements * static_cast<int64_t>(bytes_per);
  std::string* contents = request->add_raw_input_contents();
  const bool has_data = at[kData].has_value();
  int64_t binary_size = -1;
  if (at[kParameters]) {
    if (const Kind kind = at[kParameters]->Peek(); kind != Kind::kObject) {
      return Expected(absl::StrCat(field, ".parameters"), "an object", kind);
    }
    std::array<std::optional<JsonReader>, 1> size;
    FindMembers<1>(*at[kParameters], {"binary_data_size"}, &size);
    if (size[0] && (size[0]->Peek() != Kind::kInteger || (binary_size = size[0]->Integer()) < 0)) {
      return Invalid(absl::StrCat(field, ".parameters.binary_data_size"),
                     "expected a non-negative integer");
    }
  }
  if (binary_size >= 0) {
    if (has_data) {
      return Invalid(field, "has both 'data' and parameters.binary_data_size; send one");
    }
    if (binary_size != want_bytes) {
      return Invalid(
          absl::StrCat(field, ".parameters.binary_data_size"),
          absl::StrCat("shape [", absl::StrJoin(in->shape(), ","), "] of ", datatype, " needs ",
                       want_bytes < 0 ? std::string("too many") : absl::StrCat(want_bytes),
                       " bytes, got ", binary_size));
    }
    if (static_cast<size_t>(binary_size) > binary->size()) {
      return Invalid(absl::StrCat(field, ".parameters.binary_data_size"),
                     absl::StrCat(binary_size, " bytes, but only ", binary->size(),
                                  " bytes of binary data are left after the JSON header"));
    }
    contents->assign(binary->data(), static_cast<size_t>(binary_size));
    binary->remove_prefix(static_cast<size_t>(binary_size));
    return absl::OkStatus();
  }
  if (!has_data) {
    return Invalid(field, "no data; send 'data' or parameters.binary_data_size");
  }
  if (bytes_per == 2) {
    return Invalid(absl::StrCat(field, ".data"),
                   absl::StrCat(datatype,
                                " has no JSON form here; send it as binary data "
                                "(parameters.binary_data_size), or send FP32"));
  }
  const std::string data_field = absl::StrCat(field, ".data");
  // Counted before anything is allocated: a shape claiming more than the
  // JSON holds is refused here. Then read again, into the tensor.
  JsonReader count_at = *at[kData];
  int64_t count = 0;
  if (absl::Status s = CountLeaves(count_at, data_field, 0, elements, &count); !s.ok()) return s;
  if (count != elements) {
    return Invalid(
        data_field,
        absl::StrCat("shape [", absl::StrJoin(in->shape(), ","), "] holds ",
                     elements > kCap ? std::string("too many") : absl::StrCat(elements),
                     " elements, got ", count > elements ? "more" : absl::StrCat(count)));
  }
  contents->resize(static_cast<size_t>(want_bytes));
  int64_t written = 0;
  return WriteLeaves(*at[kData], data_field, bytes_per == 1, contents->data(), &written);
}

// Decodes output `i` (at `r`).
absl::Status DecodeOutput(JsonReader& r, int i, RestInferRequest* out) {
  const std::string field = absl::StrCat("outputs[", i, "]");
  std::array<std::optional<JsonReader>, 2> at;
  if (r.Peek() == Kind::kObject) {
    FindMembers<2>(r, {"name", "parameters"}, &at);
  } else {
    r.Skip();
  }
  if (!at[0] || at[0]->Peek() != Kind::kString) {
    return Invalid(absl::StrCat(field, ".name"), "expected a string");
  }
  const std::string name = at[0]->String();
  out->request.add_outputs()->set_name(name);
  if (!at[1]) return absl::OkStatus();
  JsonReader& params = *at[1];
  if (const Kind kind = params.Peek(); kind != Kind::kObject) {
    return Expected(absl::StrCat(field, ".parameters"), "an object", kind);
  }
  params.Enter();
  std::string pname;
  while (params.NextKey(&pname)) {
    if (pname == "binary_data") {
      if (const Kind kind = params.Peek(); kind != Kind::kBool) {
        return Expected(absl::StrCat(field, ".parameters.binary_data"), "a boolean", kind);
      }
      if (params.Bool()) out->binary_outputs.push_back(name);
      continue;
    }
    if (pname == "classification") {
      return absl::UnimplementedError(
          absl::StrCat(field, ".parameters.classification: this model's outputs are not classes"));
    }
    params.Skip();
  }
  return absl::OkStatus();
}

absl::Status DecodeRequest(JsonReader& r, absl::string_view binary, RestInferRequest* out) {
  if (const Kind kind = r.Peek(); kind != Kind::kObject) {
    return Expected("request body", "a JSON object", kind);
  }
  inference::ModelInferRequest& request = out->request;
  r.Enter();
  std::string key;
  while (r.NextKey(&key)) {
    const Kind kind = r.Peek();
    if (key == "id") {
      if (kind != Kind::kString) return Expected("id", "a string", kind);
      request.set_id(r.String());
    } else if (key == "parameters") {
      if (kind != Kind::kObject) return Expected("parameters", "an object", kind);
      r.Enter();
      std::string name;
      while (r.NextKey(&name)) {
        if (name == "binary_data_output") {
          if (const Kind k = r.Peek(); k != Kind::kBool) {
            return Expected("parameters.binary_data_output", "a boolean", k);
          }
          out->all_binary = r.Bool();
          continue;
        }
        const std::string field = absl::StrCat("parameters['", Shown(name), "']");
        auto& parameter = (*request.mutable_parameters())[name];
        if (absl::Status s = ToParameter(field, r, &parameter); !s.ok()) return s;
      }
    } else if (key == "inputs") {
      if (kind != Kind::kArray) return Expected("inputs", "an array", kind);
      r.Enter();
      for (int i = 0; r.NextElement(); ++i) {
        if (absl::Status s = DecodeInput(r, i, &binary, &request); !s.ok()) return s;
      }
    } else if (key == "outputs") {
      if (kind != Kind::kArray) return Expected("outputs", "an array", kind);
      r.Enter();
      for (int i = 0; r.NextElement(); ++i) {
        if (absl::Status s = DecodeOutput(r, i, out); !s.ok()) return s;
      }
    } else {
      r.Skip();
    }
  }
  if (!binary.empty()) {
    return Invalid("request body",
                   absl::StrCat(binary.size(),
                                " bytes of binary data after the JSON header that no input's "
                                "parameters.binary_data_size claims"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RestInferRequest> DecodeRestInfer(absl::string_view body,
                                                 std::optional<size_t> header_length,
                                                 const std::string& model,
                                                 const std::string& version) {
  const size_t json_length = header_length.value_or(body.size());
  if (json_length > body.size()) {
    return Invalid(
        "Inference-Header-Content-Length",
        absl::StrCat("expected at most the body's ", body.size(), " bytes, got ", json_length));
  }
  const absl::string_view json = body.substr(0, json_length);
  // The whole text is checked first: a syntax error is reported as such,
  // before any field's error.
  if (absl::Status valid = JsonReader::Validate(json); !valid.ok()) {
    return Invalid("request body", absl::StrCat("not valid JSON (", valid.message(), ")"));
  }
  RestInferRequest out;
  out.request.set_model_name(model);
  out.request.set_model_version(version);
  JsonReader r(json);
  absl::Status s = DecodeRequest(r, body.substr(json_length), &out);
  if (!s.ok()) return s;
  return out;
}

}  // namespace attention::server
