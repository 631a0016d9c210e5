// File: client/cli/cli_flags.h
//
// attention-client's command-line flags (defined in cli_flags.cc, whose
// flags --help lists) and the check of their numeric ranges. Read once by
// main() before any command runs.
#ifndef ATTENTION_CLIENT_CLI_CLI_FLAGS_H_
#define ATTENTION_CLIENT_CLI_CLI_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"

ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(int64_t, deadline_ms);
ABSL_DECLARE_FLAG(std::string, lb_policy);
ABSL_DECLARE_FLAG(bool, tls);
ABSL_DECLARE_FLAG(std::string, tls_ca_file);
ABSL_DECLARE_FLAG(std::string, tls_cert_file);
ABSL_DECLARE_FLAG(std::string, tls_key_file);
ABSL_DECLARE_FLAG(std::string, tls_server_name);
ABSL_DECLARE_FLAG(std::string, token_file);
ABSL_DECLARE_FLAG(int, max_message_bytes);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(int64_t, model_version);
ABSL_DECLARE_FLAG(std::string, query);
ABSL_DECLARE_FLAG(std::string, key);
ABSL_DECLARE_FLAG(std::string, value);
ABSL_DECLARE_FLAG(std::string, key_padding_mask);
ABSL_DECLARE_FLAG(std::string, attn_mask);
ABSL_DECLARE_FLAG(int64_t, batch);
ABSL_DECLARE_FLAG(std::string, seq_len);
ABSL_DECLARE_FLAG(std::string, kv_seq_len);
ABSL_DECLARE_FLAG(uint32_t, seed);
ABSL_DECLARE_FLAG(bool, is_causal);
ABSL_DECLARE_FLAG(bool, need_weights);
ABSL_DECLARE_FLAG(bool, per_head_weights);
ABSL_DECLARE_FLAG(std::string, output_dtype);
ABSL_DECLARE_FLAG(std::string, output);
ABSL_DECLARE_FLAG(std::string, weights_output);
ABSL_DECLARE_FLAG(std::string, request_id);
ABSL_DECLARE_FLAG(std::string, service);
ABSL_DECLARE_FLAG(std::string, concurrency);
ABSL_DECLARE_FLAG(std::string, duration);
ABSL_DECLARE_FLAG(int64_t, requests);
ABSL_DECLARE_FLAG(double, rate);
ABSL_DECLARE_FLAG(std::string, rpc);
ABSL_DECLARE_FLAG(std::string, protocol);
ABSL_DECLARE_FLAG(double, pad_share);
ABSL_DECLARE_FLAG(std::string, csv);
ABSL_DECLARE_FLAG(std::string, json);
ABSL_DECLARE_FLAG(int64_t, tokens);
ABSL_DECLARE_FLAG(int64_t, chunk);
ABSL_DECLARE_FLAG(int64_t, sessions);
ABSL_DECLARE_FLAG(int64_t, steps);
ABSL_DECLARE_FLAG(int64_t, context);

namespace attention::client {

// INVALID_ARGUMENT naming the flag and its value ("--batch=-1: expected a
// number >= 1") when a numeric flag is out of its range; OK otherwise.
absl::Status CheckFlagRanges();

}  // namespace attention::client

#endif  // ATTENTION_CLIENT_CLI_CLI_FLAGS_H_
