// File: tests/fuzz/rest_encode_oracle.h
//
// The REST infer response encoder as it was before it could size a
// response without building it: rest_encode.h's output must be
// byte-identical to it. Stateless; thread-safe.
#ifndef ATTENTION_TESTS_FUZZ_REST_ENCODE_ORACLE_H_
#define ATTENTION_TESTS_FUZZ_REST_ENCODE_ORACLE_H_

#include "inference/grpc_predict_v2.pb.h"
#include "server/frontends/rest/rest_codec.h"
#include "server/frontends/rest/rest_encode.h"

namespace attention::fuzz {

// Consumes `response`'s raw contents, as EncodeRestInfer does.
server::RestBody EncodeRestInferAsBefore(inference::ModelInferResponse& response,
                                         const server::RestInferRequest& asked);

}  // namespace attention::fuzz

#endif  // ATTENTION_TESTS_FUZZ_REST_ENCODE_ORACLE_H_
