// File: server/security/token_authenticator.h
//
// Bearer-token authentication and per-model authorisation, from a file of
// SHA-256 token hashes (--auth_tokens_file). Clients send
// `authorization: Bearer <token>`; the server hashes what it receives and
// compares the hash with every entry in constant time, so neither the file
// nor the comparison's timing gives a token away. Tokens are never logged
// and never reach metrics; a caller is named in messages by its entry's
// name, and identified (what it owns) by its entry's hash: Principal::id.
//
// The file, one entry per line ('#' starts a comment):
//
//   <sha256 of the token, 64 hex digits>  <name>  <models: a,b,c or *>  [options]
//
// Options, each at most once: weight=N (1 to 1000, default 1), the token's
// share of a busy model's compute against other tokens' (fair queuing,
// server/batching/fair_queue.h); rate=R, at most R requests a second;
// token_rate=T, at most T query tokens a second (a request's batch x query
// length, an append's tokens). Over a rate, requests are refused
// RESOURCE_EXHAUSTED with a retry hint. Without them: weight 1, no limit.
//
// A name is 1 to 128 characters of [A-Za-z0-9._:@/-], so that it can be
// written into a log line as it is; names may repeat (hashes may not).
//
// The file is re-read when it changes (checked every `reload_interval`), so
// tokens rotate without a restart. It is read only once it is stable: its
// identity (inode, size, ctime and mtime; the writer can set mtime back, not
// ctime) unchanged across two consecutive checks, and again after reading.
// So a file truncated and then rewritten in place (`cmd > tokens`) is never
// installed empty or half-written, and an empty file revokes every token
// only once it has stayed empty for two checks. A file that fails to parse on
// reload is reported on stderr and the previous tokens stay in force.
//
// Thread-safe. Owns its reload thread, joined by the destructor.
#ifndef ATTENTION_SERVER_SECURITY_TOKEN_AUTHENTICATOR_H_
#define ATTENTION_SERVER_SECURITY_TOKEN_AUTHENTICATOR_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attention::server {

// Who a token belongs to and what it may call.
struct Principal {
  // The hex SHA-256 of the token: the entry's hash, unique per entry (the
  // parser refuses a repeated hash). Sessions and sequences are owned by it,
  // never by `name`, which other entries may share.
  std::string id;
  // The entry's name, for messages and logs ([A-Za-z0-9._:@/-], 1 to 128).
  std::string name;
  bool all_models = false;
  absl::flat_hash_set<std::string> models;
  int64_t weight = 1;     // weight=: the share of a busy model's compute.
  double rate = 0;        // rate=: requests per second; 0: no limit.
  double token_rate = 0;  // token_rate=: query tokens per second; 0: no limit.

  bool MayUse(absl::string_view model) const { return all_models || models.contains(model); }
};

class TokenAuthenticator {
 public:
  using Sha256 = std::array<uint8_t, 32>;
  struct Entry {
    Sha256 hash;
    std::shared_ptr<const Principal> principal;
  };

  // Reads `path` and starts watching it. NOT_FOUND if it cannot be read,
  // INVALID_ARGUMENT (naming the line) if it does not parse. A non-empty
  // `unknown_token_note` is added, in parentheses, to the refusal of an
  // unknown token (a generic hint: it says nothing about the token itself).
  static absl::StatusOr<std::unique_ptr<TokenAuthenticator>> Open(
      const std::string& path, absl::Duration reload_interval = absl::Seconds(2),
      std::string unknown_token_note = "");

  // Parses a token file's text; `path` names it in errors. INVALID_ARGUMENT
  // naming the line for a malformed hash, a name outside the allowed set, an
  // empty model list, or a hash already in the file.
  static absl::StatusOr<std::vector<Entry>> Parse(absl::string_view text, const std::string& path);

  static Sha256 Hash(absl::string_view token);

  ~TokenAuthenticator();
  TokenAuthenticator(const TokenAuthenticator&) = delete;
  TokenAuthenticator& operator=(const TokenAuthenticator&) = delete;

  // The principal of an `authorization` header value ("Bearer <token>"),
  // or UNAUTHENTICATED (missing header, another scheme, unknown token).
  absl::StatusOr<std::shared_ptr<const Principal>> Authenticate(
      const absl::string_view* authorization) const;

  // Tokens in force.
  size_t size() const;

 private:
  TokenAuthenticator(std::string path, absl::Duration reload_interval,
                     std::string unknown_token_note);
  // One check: re-reads the file if its identity (inode, size, ctime,
  // mtime) differs from the installed one and equals the previous check's.
  void ReloadIfChanged();
  void WatchLoop();

  const std::string path_;
  const absl::Duration reload_interval_;
  const std::string unknown_token_note_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const std::vector<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  std::string file_identity_ ABSL_GUARDED_BY(mu_);  // Of the file installed (or refused).
  std::string seen_identity_ ABSL_GUARDED_BY(mu_);  // At the previous check.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SECURITY_TOKEN_AUTHENTICATOR_H_
