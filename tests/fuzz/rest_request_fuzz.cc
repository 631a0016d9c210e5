// The REST front-end's request decoding (server/frontends/rest/rest_codec.h):
// arbitrary bytes as an infer request's body, the first byte choosing
// whether an Inference-Header-Content-Length is sent (and the next two its
// value), then, when it decodes, the Open Inference Protocol's own decoding
// of the result (oip_codec.h) and the response encoding (rest_encode.h) of
// a response made from the decoded inputs.
//
// Checked: no crash, no sanitizer report; the decoder agrees with the DOM
// decoder it replaced (rest_codec_dom_oracle.h) and the response encoder is
// byte-identical to the former one, of the size it computes; every refusal is INVALID_ARGUMENT
// or UNIMPLEMENTED with a message; every decoded input's bytes are exactly
// its shape's element count times its datatype's size (the decoder promises
// to check before allocating); the encoded response's JSON part parses.
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/frontends/protocol/oip_codec.h"
#include "server/frontends/rest/rest_codec.h"
#include "server/frontends/rest/rest_encode.h"
#include "tests/fuzz/fuzz_entries.h"
#include "tests/fuzz/rest_codec_dom_oracle.h"
#include "tests/fuzz/rest_encode_oracle.h"

namespace attention::fuzz {
namespace {

absl::Status Bug(const std::string& what) { return absl::InternalError(what); }

int64_t BytesPer(const std::string& datatype) {
  if (datatype == "FP32") return 4;
  if (datatype == "FP16" || datatype == "BF16") return 2;
  if (datatype == "BOOL") return 1;
  return -1;
}

}  // namespace

absl::Status FuzzOneRestRequest(const uint8_t* data, size_t size) {
  if (size < 3) return absl::OkStatus();
  std::optional<size_t> header_length;
  if (data[0] & 1) header_length = static_cast<size_t>(data[1]) | (size_t{data[2]} << 8);
  const std::string body(reinterpret_cast<const char*>(data + 3), size - 3);
  // The in-place decoder decodes exactly as the DOM decoder it replaced.
  if (absl::Status same = CompareWithDomOracle(body, header_length); !same.ok()) return same;
  absl::StatusOr<server::RestInferRequest> decoded =
      server::DecodeRestInfer(body, header_length, "small", "");
  if (!decoded.ok()) {
    const absl::StatusCode code = decoded.status().code();
    if (code != absl::StatusCode::kInvalidArgument && code != absl::StatusCode::kUnimplemented) {
      return Bug(absl::StrCat("refused with an unexpected code: ", decoded.status().ToString()));
    }
    if (decoded.status().message().empty()) return Bug("a refusal without a message");
    return absl::OkStatus();
  }
  const inference::ModelInferRequest& request = decoded->request;
  if (request.raw_input_contents_size() != request.inputs_size()) {
    return Bug("raw_input_contents and inputs differ in number");
  }
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& in = request.inputs(i);
    int64_t elements = 1;
    for (int64_t d : in.shape()) {
      if (d < 0 || (d != 0 && elements > (int64_t{1} << 40) / d)) {
        return Bug(absl::StrCat("input ", i, " decoded with an impossible shape"));
      }
      elements *= d;
    }
    if (static_cast<int64_t>(request.raw_input_contents(i).size()) !=
        elements * BytesPer(in.datatype())) {
      return Bug(absl::StrCat("input ", i, " has ", request.raw_input_contents(i).size(),
                              " bytes for ", elements, " elements of ", in.datatype()));
    }
  }
  // The protocol's own decoding of what the REST decoder produced.
  absl::StatusOr<server::OipRequest> oip = server::DecodeModelInfer(request);
  if (!oip.ok() && oip.status().code() != absl::StatusCode::kInvalidArgument) {
    return Bug(absl::StrCat("DecodeModelInfer: ", oip.status().ToString()));
  }
  // A response echoing each input as an output, encoded as asked.
  inference::ModelInferResponse response;
  response.set_model_name("small");
  response.set_model_version("1");
  response.set_id(request.id().substr(0, 64));
  for (int i = 0; i < request.inputs_size(); ++i) {
    auto* out = response.add_outputs();
    out->set_name(request.inputs(i).name());
    out->set_datatype(request.inputs(i).datatype());
    *out->mutable_shape() = request.inputs(i).shape();
    response.add_raw_output_contents(request.raw_input_contents(i));
  }
  const auto raw = response.raw_output_contents();
  const size_t exact = server::RestInferEncodedSize(response, *decoded, /*bound=*/false);
  if (server::RestInferEncodedSize(response, *decoded, /*bound=*/true) < exact) {
    return Bug("the encoded size's bound is below its exact size");
  }
  const server::RestBody encoded = server::EncodeRestInfer(response, *decoded);
  // Byte-identical to the encoder before it sized responses, and of the size computed.
  inference::ModelInferResponse again = response;  // No map: the same order.
  *again.mutable_raw_output_contents() = raw;
  const server::RestBody before = EncodeRestInferAsBefore(again, *decoded);
  if (encoded.bytes != before.bytes || encoded.header_length != before.header_length) {
    return Bug("the encoding differs from the former encoder's");
  }
  if (encoded.bytes.size() != exact) {
    return Bug(absl::StrCat("encoded ", encoded.bytes.size(), " bytes, sized ", exact));
  }
  const size_t json_length = encoded.header_length.value_or(encoded.bytes.size());
  if (json_length > encoded.bytes.size()) return Bug("header length past the body");
  // NaN and infinities are written as JavaScript writes them; nlohmann's
  // strict parser refuses those, so they are checked by replacement.
  std::string json = encoded.bytes.substr(0, json_length);
  for (const char* token : {"-Infinity", "Infinity", "NaN"}) {
    for (size_t at; (at = json.find(token)) != std::string::npos;)
      json.replace(at, strlen(token), "0");
  }
  if (!nlohmann::json::accept(json)) return Bug("the encoded response is not JSON");
  return absl::OkStatus();
}

}  // namespace attention::fuzz
