// File: tests/fuzz/rest_codec_dom_oracle.h
//
// The REST infer request decoder as it was when it parsed with simdjson's
// DOM: an oracle for the in-place decoder (server/frontends/rest/
// rest_codec.h), which must accept what it accepts, produce the same
// request, and refuse with the same code and message (a syntax error's
// description aside). Stateless; thread-safe.
#ifndef ATTENTION_TESTS_FUZZ_REST_CODEC_DOM_ORACLE_H_
#define ATTENTION_TESTS_FUZZ_REST_CODEC_DOM_ORACLE_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/frontends/rest/rest_codec.h"

namespace attention::fuzz {

absl::StatusOr<server::RestInferRequest> DecodeRestInferWithDom(absl::string_view body,
                                                                std::optional<size_t> header_length,
                                                                const std::string& model,
                                                                const std::string& version);

// OK when DecodeRestInfer and DecodeRestInferWithDom agree on `body`; else
// INTERNAL saying how they differ.
absl::Status CompareWithDomOracle(absl::string_view body, std::optional<size_t> header_length);

}  // namespace attention::fuzz

#endif  // ATTENTION_TESTS_FUZZ_REST_CODEC_DOM_ORACLE_H_
