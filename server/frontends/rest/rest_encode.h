// File: server/frontends/rest/rest_encode.h
//
// The KServe v2 REST inference response, from the Open Inference Protocol's
// ModelInferResponse: JSON `data` (floats in their shortest round-trip form;
// NaN and infinities as NaN, Infinity, -Infinity, which JSON proper cannot
// hold: ask for binary outputs where that matters), or with Triton's
// `binary_data` (per output, or `binary_data_output` for all) the output's
// bytes after the JSON and `binary_data_size` in its parameters.
//
// Stateless functions; thread-safe.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_ENCODE_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_ENCODE_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "inference/grpc_predict_v2.pb.h"
#include "server/frontends/rest/rest_codec.h"

namespace attention::server {

struct RestBody {
  std::string bytes;
  // Set when binary outputs follow the JSON: the JSON part's length (the
  // Inference-Header-Content-Length header).
  std::optional<size_t> header_length;
};

// Encodes `response` (its outputs' bytes in raw_output_contents), consuming
// its raw contents (each released once written). `size`: the encoded size
// when known (RestInferEncodedSize), else 0; the body is allocated once.
RestBody EncodeRestInfer(inference::ModelInferResponse& response, const RestInferRequest& asked,
                         size_t size = 0);

// The bytes EncodeRestInfer would write, computed without writing them:
// exactly, or (`bound`) at most that, counting every float at its longest
// (15 bytes), which costs no formatting.
size_t RestInferEncodedSize(const inference::ModelInferResponse& response,
                            const RestInferRequest& asked, bool bound);

// EncodeRestInfer, unless the encoding would be larger than `max_bytes`:
// then RESOURCE_EXHAUSTED naming its exact size, with nothing built (a JSON
// response is ~3x its tensors' binary size). The front-end's one call.
absl::StatusOr<RestBody> EncodeRestInferWithin(inference::ModelInferResponse& response,
                                               const RestInferRequest& asked, size_t max_bytes);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_ENCODE_H_
