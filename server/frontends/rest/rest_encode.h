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
// its raw contents.
RestBody EncodeRestInfer(inference::ModelInferResponse& response, const RestInferRequest& asked);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_ENCODE_H_
