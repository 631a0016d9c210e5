// File: server/frontends/protocol/oip_codec.h
//
// The Open Inference Protocol (inference.GRPCInferenceService) in the
// engine's terms: a ModelInferRequest decoded into the engine's inputs (views
// of the request's bytes, no copies), its parameters and the outputs asked
// for; and a computed outcome encoded into a ModelInferResponse.
//
// Inputs by name: `query` (required), `key`, `value`, `key_padding_mask`,
// `attn_mask`, with datatypes "FP32", "FP16", "BF16" or "BOOL", sent either
// all as raw_input_contents (in the order of `inputs`) or all as typed
// contents (fp32_contents, bool_contents). Parameters: `is_causal`,
// `need_weights`, `average_attn_weights` (bool), Triton's `timeout` (µs in
// the queue) and `priority` (accepted; the queue is FIFO), and the sequence
// parameters `sequence_id`, `sequence_start`, `sequence_end`. Other
// parameters are ignored. Outputs: `output` and `attn_weights`.
//
// Stateless functions; thread-safe.
#ifndef ATTENTION_SERVER_FRONTENDS_PROTOCOL_OIP_CODEC_H_
#define ATTENTION_SERVER_FRONTENDS_PROTOCOL_OIP_CODEC_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/mha_engine.h"
#include "inference/grpc_predict_v2.pb.h"
#include "server/batching/pending_request.h"

namespace attention::server {

enum class OipOutput { kOutput, kAttnWeights };

struct OipRequest {
  MhaInputs inputs;                       // Views of the request's bytes.
  std::vector<OipOutput> outputs;         // To return, in this order.
  std::optional<absl::Duration> timeout;  // Triton's `timeout`: the longest wait in the queue.
  // Triton's sequence parameters (set: the request appends to a session).
  std::optional<std::string> sequence_id;
  bool sequence_start = false;
  bool sequence_end = false;
};

// Decodes `request` (which must outlive the views). INVALID_ARGUMENT naming
// the input, field or parameter, with the expected and actual values.
absl::StatusOr<OipRequest> DecodeModelInfer(const inference::ModelInferRequest& request);

// The datatype string of `dtype`: "FP32", "BF16", "FP16", "BOOL".
const char* OipDatatype(DType dtype);

// Fills `response`'s outputs and raw_output_contents with the `outputs` of
// `outcome`, moving their bytes, and its parameters `queue_us`, `compute_us`
// and `batch_requests` (int64) with the outcome's timing. RESOURCE_EXHAUSTED (response cleared)
// above `max_bytes`.
absl::Status EncodeModelInfer(RequestOutcome& outcome, const std::vector<OipOutput>& outputs,
                              int64_t max_bytes, inference::ModelInferResponse* response);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_PROTOCOL_OIP_CODEC_H_
