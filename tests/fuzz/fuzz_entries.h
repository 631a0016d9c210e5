// File: tests/fuzz/fuzz_entries.h
//
// The fuzz targets' entry functions: one input's bytes through the product's
// own code, as the server, the model loader or the client would run it. The
// libFuzzer binaries (tests/fuzz/libfuzzer_main.cc, built with clang in
// build-asan/) and fuzz_regression_test (every compiler, in the ordinary
// test suite) call the same functions.
//
// Each returns the product's verdict: OK, or the error it gave, which for a
// malformed input is the expected outcome. A verdict for which IsFuzzBug()
// is true is a bug even without a crash: a code no input may cause
// (INTERNAL, UNKNOWN, ...), or a broken invariant the entry checks itself
// (an accepted input that does not round-trip, a batched result that differs
// from the solo one), reported as INTERNAL starting "fuzz invariant: ".
//
// Thread-compatible: a fuzzer calls them from one thread.
#ifndef ATTENTION_TESTS_FUZZ_FUZZ_ENTRIES_H_
#define ATTENTION_TESTS_FUZZ_FUZZ_ENTRIES_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace attention::fuzz {

// A model directory: the first two bytes (little-endian) are the length of
// config.json, which follows; the rest is model.safetensors. Loads it as the
// server does (MhaModel::FromBytes); a model that loads and is small also
// gets an engine and one forward pass.
absl::Status FuzzOneModelDir(const uint8_t* data, size_t size);

// attention.v1.InferRequest bytes, decoded and validated by the server's own
// AttentionServiceImpl::Prepare against small models ("self": E=8, 2 heads;
// "cross": E=8, kdim 6, vdim 4, bias_kv, zero_attn, bfloat16 compute); a
// request that validates and is small is computed by the batcher's RunBatch,
// together with a fixed companion request, encoded, and compared with the
// engine's solo result.
absl::Status FuzzOneInferRequest(const uint8_t* data, size_t size);

// .npy bytes through attention-client's reader; an accepted file must write
// back and read again to the same tensor.
absl::Status FuzzOneNpy(const uint8_t* data, size_t size);

// A session fuzz input (tests/fuzz/session_fuzz.cc): a small model, up to
// three self or cross sessions of it and rounds of pipelined appends,
// through SessionEngine at the core level; every row checked against the
// stateless MhaEngine forward over the sequence so far.
absl::Status FuzzOneSession(const uint8_t* data, size_t size);

// Open Inference Protocol ModelInferRequests (parsed from the bytes, or
// generated from them: tests/fuzz/oip_request_gen.h) through the server's
// decode, validation, admission, batcher, sequence sessions and encoder
// (tests/fuzz/oip_request_fuzz.cc).
absl::Status FuzzOneOipRequest(const uint8_t* data, size_t size);

absl::Status FuzzOneRestRequest(const uint8_t* data, size_t size);

// What a client sends on one REST connection, through the HTTP server
// (tests/fuzz/http_request_fuzz.cc): the answers must be whole responses.
absl::Status FuzzOneHttpRequest(const uint8_t* data, size_t size);

// True for a verdict no input should produce (see above).
inline bool IsFuzzBug(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kFailedPrecondition:
      return false;
    default:
      return true;
  }
}

}  // namespace attention::fuzz

#endif  // ATTENTION_TESTS_FUZZ_FUZZ_ENTRIES_H_
