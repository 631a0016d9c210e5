// File: tests/fuzz/oip_request_gen.h
//
// The Open Inference Protocol fuzzer's inputs: inference.ModelInferRequest
// messages, either parsed from the input's bytes (length-prefixed protobuf
// messages, so libFuzzer mutates the wire format itself) or generated from
// them field by field (so most requests are well-formed enough to reach
// validation, admission, the batcher, sessions and the response encoder):
// models by name, query/key/value/masks with consistent or slightly wrong
// shapes, raw or typed contents, every parameter the server reads (with
// right and wrong types), Triton sequences (start, steps, end, several in
// flight) and the outputs asked for.
//
// Thread-compatible.
#ifndef ATTENTION_TESTS_FUZZ_OIP_REQUEST_GEN_H_
#define ATTENTION_TESTS_FUZZ_OIP_REQUEST_GEN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "inference/grpc_predict_v2.pb.h"
#include "tests/fuzz/fuzz_input.h"

namespace attention::fuzz {

// A served model's shape, as the generator needs it.
struct OipModelShape {
  std::string name;
  int64_t embed_dim = 0, kdim = 0, vdim = 0;
};

// One request of an input; `parsed` is false for bytes that are not a
// ModelInferRequest (gRPC refuses those before the service sees them).
struct OipInputRequest {
  std::shared_ptr<inference::ModelInferRequest> request;
  bool parsed = true;
};

// An input: its requests, and the server they go to.
struct OipInput {
  bool roomy = false;  // The server with large limits (else small ones).
  std::vector<OipInputRequest> requests;
};

// The requests of one input: the first byte picks the form (bit 0 set:
// generated from `models`, else parsed), their number (1 + bits 1-3 modulo
// kMaxOipRequests) and the server (bit 7 set: roomy, where generated
// requests are sometimes large).
OipInput ReadOipRequests(FuzzInput& in, const std::vector<OipModelShape>& models);

inline constexpr int kMaxOipRequests = 5;

}  // namespace attention::fuzz

#endif  // ATTENTION_TESTS_FUZZ_OIP_REQUEST_GEN_H_
