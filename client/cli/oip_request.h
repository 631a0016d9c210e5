// File: client/cli/oip_request.h
//
// attention.v1 requests in the Open Inference Protocol's form (KServe v2,
// inference.ModelInferRequest with raw contents), for `attention-client load
// --protocol kserve`, and the timing parameters the server adds to its
// responses. Stateless; thread-safe.
#ifndef ATTENTION_CLIENT_CLI_OIP_REQUEST_H_
#define ATTENTION_CLIENT_CLI_OIP_REQUEST_H_

#include <cstdint>
#include <string>

#include "attention/v1/attention.pb.h"
#include "inference/grpc_predict_v2.pb.h"

namespace attention::client {

// The same request as `request` (tensors as raw_input_contents, options as
// parameters) for `model`.
inference::ModelInferRequest ToModelInfer(const v1::InferRequest& request,
                                          const std::string& model);

// The int64 response parameter `name` ("queue_us", "compute_us",
// "batch_requests"), 0 when absent.
int64_t OipInt(const inference::ModelInferResponse& response, const std::string& name);

}  // namespace attention::client

#endif  // ATTENTION_CLIENT_CLI_OIP_REQUEST_H_
