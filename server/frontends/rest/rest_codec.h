// File: server/frontends/rest/rest_codec.h
//
// The KServe v2 REST inference request, with Triton's binary
// tensor extension, translated to and from the Open Inference Protocol's
// messages (which InferenceProtocol serves), so that a REST request is
// validated, batched and answered exactly as a gRPC ModelInfer is.
//
// Request body: a JSON object (`id`, `parameters`, `inputs`, `outputs`),
// optionally followed by binary tensor data; `header_length` (the
// Inference-Header-Content-Length header) is the JSON part's length. An
// input carries either `data` (JSON numbers or booleans, flat or nested, in
// row-major order; FP32 and BOOL) or `parameters.binary_data_size` (its
// bytes follow the JSON, in input order; any datatype). Every input's size
// is checked against its shape before anything is allocated for it. The
// JSON is read in place (rest_json_reader.h), no tree built: decoding costs
// the tensors it returns and O(nesting) more, and `body` needs no padding.
// Parameters are typed as JSON gives them: bool, integer (int64, or uint64
// above it), number (double), string.
//
// The response: rest_encode.h.
//
// Stateless functions; thread-safe.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_CODEC_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_CODEC_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "inference/grpc_predict_v2.pb.h"

namespace attention::server {

struct RestInferRequest {
  inference::ModelInferRequest request;
  // Outputs to return as binary data, by name; `all_binary` for every one.
  std::vector<std::string> binary_outputs;
  bool all_binary = false;
};

// Decodes `body` for `model` at `version` ("" for any). `header_length`:
// the JSON part's length, when the body carries binary data. Errors:
// INVALID_ARGUMENT naming the field, with the expected and actual values.
absl::StatusOr<RestInferRequest> DecodeRestInfer(absl::string_view body,
                                                 std::optional<size_t> header_length,
                                                 const std::string& model,
                                                 const std::string& version);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_CODEC_H_
