// File: client/cli/session_commands.h
//
// attention-client's session subcommands:
//   session: appends a random T-token sequence to a new self-attention
//     session K tokens at a time, checks every output row against one
//     stateless Infer over the whole sequence with is_causal, and prints the
//     per-step latency percentiles. Exit 1 on any mismatch or error.
//   load --sessions N: a decode load. N sessions each prefill C tokens, then
//     step K times one token at a time, all concurrently; prints tokens/s and
//     step latency percentiles, and its progress on stderr as it goes
//     ("prefilled 16/64 sessions", "decoded 2048/8192 tokens").
// Both print to stdout and return the process exit code.
#ifndef ATTENTION_CLIENT_CLI_SESSION_COMMANDS_H_
#define ATTENTION_CLIENT_CLI_SESSION_COMMANDS_H_

#include <cstdint>
#include <string>

namespace attention::client {

struct SessionCommandOptions {
  std::string target;
  std::string lb_policy;
  std::string model;
  int64_t deadline_ms = 10000;
  uint32_t seed = 1;
  // session
  int64_t tokens = 64;
  int64_t chunk = 1;
  // load --sessions
  int64_t sessions = 0;
  int64_t steps = 32;
  int64_t context = 0;
  std::string json;  // Also write the result as JSON here.
};

int RunSessionCheck(const SessionCommandOptions& options);
int RunDecodeLoad(const SessionCommandOptions& options);

// What the decode load says when a prefill append passed its deadline:
// "prefilling 64 x 4096 tokens took longer than --deadline_ms=10000; raise
// it ...".
std::string PrefillDeadlineMessage(int64_t sessions, int64_t context, int64_t deadline_ms);

}  // namespace attention::client

#endif  // ATTENTION_CLIENT_CLI_SESSION_COMMANDS_H_
