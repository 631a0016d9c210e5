// The REST infer decoder as it was before server/frontends/rest/rest_codec.cc
// read JSON in place (simdjson's DOM, ~15 bytes of memory per body byte):
// the oracle the fuzzer and rest_codec_test compare the decoder with. Kept
// as it was, but for its names.
#include "tests/fuzz/rest_codec_dom_oracle.h"

#include <simdjson.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/dtype.h"
#include "google/protobuf/util/message_differencer.h"
#include "nlohmann/json.hpp"
#include "server/requests/identifiers.h"

namespace attention::fuzz {
namespace {

using server::RestInferRequest;
using server::Shown;

using simdjson::dom::element;
using simdjson::dom::element_type;

// simdjson's strings as Abseil's (a distinct type in Debian's Abseil).
absl::string_view A(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

const char* TypeName(element_type t) {
  switch (t) {
    case element_type::ARRAY:
      return "an array";
    case element_type::OBJECT:
      return "an object";
    case element_type::INT64:
    case element_type::UINT64:
      return "an integer";
    case element_type::DOUBLE:
      return "a number";
    case element_type::STRING:
      return "a string";
    case element_type::BOOL:
      return "a boolean";
    case element_type::NULL_VALUE:
      return "null";
  }
  return "a value";
}

absl::Status Expected(absl::string_view field, absl::string_view expected, element e) {
  return Invalid(field, absl::StrCat("expected ", expected, ", got ", TypeName(e.type())));
}

// Bytes per element of a datatype the server takes, or 0.
size_t ElementBytes(absl::string_view datatype) {
  if (datatype == "FP32") return 4;
  if (datatype == "FP16" || datatype == "BF16") return 2;
  if (datatype == "BOOL") return 1;
  return 0;
}

// A JSON parameter value as the protocol's typed parameter.
absl::Status ToParameter(absl::string_view field, element value, inference::InferParameter* p) {
  switch (value.type()) {
    case element_type::BOOL:
      p->set_bool_param(value.get_bool().value_unsafe());
      return absl::OkStatus();
    case element_type::INT64:
      p->set_int64_param(value.get_int64().value_unsafe());
      return absl::OkStatus();
    case element_type::UINT64:
      p->set_uint64_param(value.get_uint64().value_unsafe());
      return absl::OkStatus();
    case element_type::DOUBLE:
      p->set_double_param(value.get_double().value_unsafe());
      return absl::OkStatus();
    case element_type::STRING:
      p->set_string_param(std::string(value.get_string().value_unsafe()));
      return absl::OkStatus();
    default:
      return Expected(field, "a boolean, number or string", value);
  }
}

// Counts the leaves of `data` (nested arrays), at most `limit` + 1.
absl::StatusOr<int64_t> CountLeaves(element data, const std::string& field, int depth,
                                    int64_t limit) {
  if (data.type() != element_type::ARRAY) return int64_t{1};
  if (depth > 32) return Invalid(field, "arrays nested more than 32 deep");
  int64_t n = 0;
  simdjson::dom::array array;
  if (data.get_array().get(array)) return Invalid(field, "expected an array");
  for (element e : array) {
    absl::StatusOr<int64_t> k = CountLeaves(e, field, depth + 1, limit);
    if (!k.ok()) return k.status();
    n += *k;
    if (n > limit) return n;
  }
  return n;
}

// JavaScript's NaN, Infinity and -Infinity (as Python's json and Triton's
// parser write them, and as responses carry them) are not JSON: the body is
// parsed as is first, and only when that fails, again with those tokens
// outside strings quoted, so that data leaves read them as strings.
std::optional<std::string> QuoteNonFinite(absl::string_view json) {
  std::string out;
  bool in_string = false, changed = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      out.push_back(c);
      if (c == '\\' && i + 1 < json.size()) {
        out.push_back(json[++i]);
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    bool replaced = false;
    for (absl::string_view token : {"-Infinity", "Infinity", "NaN"}) {
      if (json.substr(i, token.size()) == token) {
        absl::StrAppend(&out, "\"", token, "\"");
        i += token.size() - 1;
        replaced = changed = true;
        break;
      }
    }
    if (!replaced) out.push_back(c);
  }
  if (!changed) return std::nullopt;
  return out;
}

// A quoted non-finite token, as QuoteNonFinite writes it.
bool NonFinite(element e, double* d) {
  std::string_view s;
  if (e.get_string().get(s)) return false;
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

// Writes the leaves of `data` as `datatype` into `out`, from *i on.
absl::Status WriteLeaves(element data, const std::string& field, bool is_bool, char* out,
                         int64_t* i) {
  if (data.type() == element_type::ARRAY) {
    simdjson::dom::array array;
    if (data.get_array().get(array)) return Invalid(field, "expected an array");
    for (element e : array) {
      absl::Status s = WriteLeaves(e, field, is_bool, out, i);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  const std::string at = absl::StrCat(field, "[", *i, "]");
  if (is_bool) {
    bool b = false;
    if (data.type() == element_type::BOOL) {
      b = data.get_bool().value_unsafe();
    } else if (data.type() == element_type::INT64 &&
               (data.get_int64().value_unsafe() == 0 || data.get_int64().value_unsafe() == 1)) {
      b = data.get_int64().value_unsafe() == 1;
    } else {
      return Expected(at, "true or false (BOOL)", data);
    }
    out[*i] = b ? 1 : 0;
  } else {
    double d = 0;
    if (data.type() == element_type::DOUBLE) {
      d = data.get_double().value_unsafe();
    } else if (data.type() == element_type::INT64) {
      d = static_cast<double>(data.get_int64().value_unsafe());
    } else if (data.type() == element_type::UINT64) {
      d = static_cast<double>(data.get_uint64().value_unsafe());
    } else if (data.type() == element_type::STRING && NonFinite(data, &d)) {
      // NaN, Infinity or -Infinity, quoted by QuoteNonFinite.
    } else {
      return Expected(at, "a number (FP32)", data);
    }
    const float f = static_cast<float>(d);
    std::memcpy(out + *i * 4, &f, 4);
  }
  ++*i;
  return absl::OkStatus();
}

// Decodes input `i` into the request, taking binary data from *binary.
absl::Status DecodeInput(element input, int i, absl::string_view* binary,
                         inference::ModelInferRequest* request) {
  std::string field = absl::StrCat("inputs[", i, "]");
  simdjson::dom::object object;
  if (input.get_object().get(object)) return Expected(field, "an object", input);
  std::string_view name, datatype;
  if (object["name"].get_string().get(name)) {
    return Invalid(absl::StrCat(field, ".name"), "expected a string");
  }
  field = absl::StrCat(field, " ('", Shown(A(name)), "')");
  if (object["datatype"].get_string().get(datatype)) {
    return Invalid(absl::StrCat(field, ".datatype"), "expected a string");
  }
  const size_t bytes_per = ElementBytes(A(datatype));
  if (bytes_per == 0) {
    return Invalid(
        absl::StrCat(field, ".datatype"),
        absl::StrCat("expected FP32, FP16, BF16 or BOOL, got '", Shown(A(datatype)), "'"));
  }
  simdjson::dom::array shape;
  if (object["shape"].get_array().get(shape)) {
    return Invalid(absl::StrCat(field, ".shape"), "expected an array of integers");
  }
  auto* in = request->add_inputs();
  in->set_name(std::string(name));
  in->set_datatype(std::string(datatype));
  // Elements the shape holds, capped well below any overflow.
  constexpr int64_t kCap = int64_t{1} << 40;
  int64_t elements = 1;
  for (element d : shape) {
    int64_t v = 0;
    if (d.get_int64().get(v) || v < 0) {
      return Invalid(absl::StrCat(field, ".shape"), "expected non-negative integers");
    }
    in->add_shape(v);
    elements = (v != 0 && elements > kCap / v) ? kCap + 1 : elements * v;
  }
  const int64_t want_bytes = elements > kCap ? -1 : elements * static_cast<int64_t>(bytes_per);
  std::string* contents = request->add_raw_input_contents();
  element data;
  const bool has_data = !object["data"].get(data);
  int64_t binary_size = -1;
  element parameters;
  if (!object["parameters"].get(parameters)) {
    simdjson::dom::object p;
    if (parameters.get_object().get(p)) {
      return Expected(absl::StrCat(field, ".parameters"), "an object", parameters);
    }
    element size;
    if (!p["binary_data_size"].get(size) &&
        (size.get_int64().get(binary_size) || binary_size < 0)) {
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
          absl::StrCat("shape [", absl::StrJoin(in->shape(), ","), "] of ", A(datatype), " needs ",
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
                   absl::StrCat(A(datatype),
                                " has no JSON form here; send it as binary data "
                                "(parameters.binary_data_size), or send FP32"));
  }
  const std::string data_field = absl::StrCat(field, ".data");
  // Counted before anything is allocated: a shape claiming more than the
  // JSON holds is refused here.
  absl::StatusOr<int64_t> count = CountLeaves(data, data_field, 0, elements);
  if (!count.ok()) return count.status();
  if (*count != elements) {
    return Invalid(
        data_field,
        absl::StrCat("shape [", absl::StrJoin(in->shape(), ","), "] holds ",
                     elements > kCap ? std::string("too many") : absl::StrCat(elements),
                     " elements, got ", *count > elements ? "more" : absl::StrCat(*count)));
  }
  contents->resize(static_cast<size_t>(want_bytes));
  int64_t written = 0;
  return WriteLeaves(data, data_field, bytes_per == 1, contents->data(), &written);
}

absl::Status DecodeRequest(element root, absl::string_view binary, RestInferRequest* out) {
  simdjson::dom::object object;
  if (root.get_object().get(object)) return Expected("request body", "a JSON object", root);
  inference::ModelInferRequest& request = out->request;
  for (auto [key, value] : object) {
    if (key == "id") {
      std::string_view id;
      if (value.get_string().get(id)) return Expected("id", "a string", value);
      request.set_id(std::string(id));
    } else if (key == "parameters") {
      simdjson::dom::object p;
      if (value.get_object().get(p)) return Expected("parameters", "an object", value);
      for (auto [name, v] : p) {
        if (name == "binary_data_output") {
          if (v.get_bool().get(out->all_binary)) {
            return Expected("parameters.binary_data_output", "a boolean", v);
          }
          continue;
        }
        const std::string field = absl::StrCat("parameters['", Shown(A(name)), "']");
        auto& parameter = (*request.mutable_parameters())[std::string(name)];
        absl::Status s = ToParameter(field, v, &parameter);
        if (!s.ok()) return s;
      }
    } else if (key == "inputs") {
      simdjson::dom::array inputs;
      if (value.get_array().get(inputs)) return Expected("inputs", "an array", value);
      int i = 0;
      for (element input : inputs) {
        absl::Status s = DecodeInput(input, i++, &binary, &request);
        if (!s.ok()) return s;
      }
    } else if (key == "outputs") {
      simdjson::dom::array outputs;
      if (value.get_array().get(outputs)) return Expected("outputs", "an array", value);
      int i = 0;
      for (element output : outputs) {
        const std::string field = absl::StrCat("outputs[", i++, "]");
        std::string_view name;
        if (output["name"].get_string().get(name)) {
          return Invalid(absl::StrCat(field, ".name"), "expected a string");
        }
        request.add_outputs()->set_name(std::string(name));
        element p;
        if (output["parameters"].get(p)) continue;
        simdjson::dom::object params;
        if (p.get_object().get(params)) {
          return Expected(absl::StrCat(field, ".parameters"), "an object", p);
        }
        for (auto [pname, v] : params) {
          if (pname == "binary_data") {
            bool binary_out = false;
            if (v.get_bool().get(binary_out)) {
              return Expected(absl::StrCat(field, ".parameters.binary_data"), "a boolean", v);
            }
            if (binary_out) out->binary_outputs.emplace_back(name);
          } else if (pname == "classification") {
            return absl::UnimplementedError(absl::StrCat(
                field, ".parameters.classification: this model's outputs are not classes"));
          }
        }
      }
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

absl::StatusOr<RestInferRequest> DecodeRestInferWithDom(absl::string_view body,
                                                        std::optional<size_t> header_length,
                                                        const std::string& model,
                                                        const std::string& version) {
  const size_t json_length = header_length.value_or(body.size());
  if (json_length > body.size()) {
    return Invalid(
        "Inference-Header-Content-Length",
        absl::StrCat("expected at most the body's ", body.size(), " bytes, got ", json_length));
  }
  simdjson::dom::parser parser;
  element root;
  auto error = parser.parse(body.data(), json_length, true).get(root);
  std::optional<std::string> quoted;
  if (error) quoted = QuoteNonFinite(body.substr(0, json_length));
  if (quoted) error = parser.parse(quoted->data(), quoted->size(), true).get(root);
  if (error) {
    return Invalid("request body",
                   absl::StrCat("not valid JSON (", simdjson::error_message(error), ")"));
  }
  RestInferRequest out;
  out.request.set_model_name(model);
  out.request.set_model_version(version);
  absl::Status s = DecodeRequest(root, body.substr(json_length), &out);
  if (!s.ok()) return s;
  return out;
}

}  // namespace attention::fuzz

namespace attention::fuzz {

absl::Status CompareWithDomOracle(absl::string_view body, std::optional<size_t> header_length) {
  const absl::StatusOr<RestInferRequest> got =
      server::DecodeRestInfer(body, header_length, "m", "1");
  const absl::StatusOr<RestInferRequest> want =
      DecodeRestInferWithDom(body, header_length, "m", "1");
  const auto differ = [&](absl::string_view how) {
    return absl::InternalError(absl::StrCat("the in-place decoder and the DOM oracle differ (", how,
                                            "): ", got.ok() ? "OK" : got.status().ToString(),
                                            " vs ", want.ok() ? "OK" : want.status().ToString()));
  };
  if (got.ok() != want.ok()) return differ("one accepts");
  if (!got.ok()) {
    if (got.status().code() != want.status().code()) return differ("codes");
    // Syntax errors are described in each parser's words.
    const bool syntax = absl::StrContains(got.status().message(), "not valid JSON (") &&
                        absl::StrContains(want.status().message(), "not valid JSON (");
    if (!syntax && got.status().message() != want.status().message()) return differ("messages");
    return absl::OkStatus();
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(got->request, want->request)) {
    return differ(absl::StrCat("requests: ", got->request.ShortDebugString().substr(0, 300), " vs ",
                               want->request.ShortDebugString().substr(0, 300)));
  }
  if (got->binary_outputs != want->binary_outputs || got->all_binary != want->all_binary) {
    return differ("binary outputs");
  }
  return absl::OkStatus();
}

}  // namespace attention::fuzz
