#include "server/security/token_authenticator.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status_macros.h"

namespace attention::server {

// How each client of this project takes its token, for UNAUTHENTICATED
// answers (client/cli/main.cc, client/python/attention_client/client.py,
// client/node/lib/common.js name them).
constexpr absl::string_view kHowClientsSendIt =
    "(attention-client: --token_file=<file>; Python: AttentionClient(..., token=... or "
    "token_file=...); Node: new AttentionClient(..., {token} or {tokenFile}); all three read "
    "the environment variable ATTENTION_TOKEN when none is given; REST: the header "
    "'Authorization: Bearer <token>')";
namespace {

// "inode size ctime mtime" of `path` (following symlinks, as a Kubernetes
// Secret swaps its ..data link), or empty if it cannot be read. Every write
// changes ctime, which (unlike mtime) the writer cannot set.
std::string FileIdentity(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_ino, " ", st.st_size, " ", st.st_ctim.tv_sec, ".", st.st_ctim.tv_nsec,
                      " ", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

constexpr size_t kMaxNameLength = 128;

// A name that can be written into a log line as it is: [A-Za-z0-9._:@/-].
bool IsAllowedNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' ||
         c == '@' || c == '/' || c == '-';
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--auth_tokens_file: cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = absl::ascii_tolower(c);
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// One of an entry's optional `key=value` fields: weight (1 to 1000),
// rate (requests per second) or token_rate (query tokens per second), each
// at most once.
absl::Status ParseOption(absl::string_view field, const std::string& where, bool seen[3],
                         Principal* principal) {
  const size_t eq = field.find('=');
  const absl::string_view key = field.substr(0, eq);
  const int which = key == "weight" ? 0 : key == "rate" ? 1 : key == "token_rate" ? 2 : -1;
  if (eq == absl::string_view::npos || which < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "unknown field '", field.substr(0, 64),
                     "'; after the models an entry takes weight=N, rate=R and token_rate=T"));
  }
  if (seen[which]) {
    return absl::InvalidArgumentError(absl::StrCat(where, key, ": given twice"));
  }
  seen[which] = true;
  const absl::string_view value = field.substr(eq + 1);
  if (which == 0) {
    int64_t weight = 0;
    if (!absl::SimpleAtoi(value, &weight) || weight < 1 || weight > 1000) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "weight: expected an integer from 1 to 1000, got '", value.substr(0, 64), "'"));
    }
    principal->weight = weight;
    return absl::OkStatus();
  }
  double rate = 0;
  if (!absl::SimpleAtod(value, &rate) || !(rate > 0) || rate > 1e9) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, key, ": expected a number above 0 (per second), at most 1e9, got '",
                     value.substr(0, 64), "'"));
  }
  (which == 1 ? principal->rate : principal->token_rate) = rate;
  return absl::OkStatus();
}

}  // namespace

TokenAuthenticator::Sha256 TokenAuthenticator::Hash(absl::string_view token) {
  Sha256 hash;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), hash.data());
  return hash;
}

absl::StatusOr<std::vector<TokenAuthenticator::Entry>> TokenAuthenticator::Parse(
    absl::string_view text, const std::string& path) {
  std::vector<Entry> entries;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const size_t hash_mark = line.find('#');
    if (hash_mark != absl::string_view::npos) line = line.substr(0, hash_mark);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    const std::string where = absl::StrCat(path, ":", line_number, ": ");
    if (fields.size() < 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       "expected '<sha256 hex> <name> <models or *> [weight=N] [rate=R] "
                       "[token_rate=T]', got ",
                       fields.size(), " fields"));
    }
    Entry entry;
    if (fields[0].size() != 64) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "expected a SHA-256 hash of 64 hex digits, got ", fields[0].size(),
          " characters (store `printf %s TOKEN | sha256sum`, never the token itself)"));
    }
    for (int i = 0; i < 32; ++i) {
      const int hi = HexValue(fields[0][2 * i]), lo = HexValue(fields[0][2 * i + 1]);
      if (hi < 0 || lo < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "the SHA-256 hash has a character that is not a hex digit"));
      }
      entry.hash[i] = static_cast<uint8_t>(hi * 16 + lo);
    }
    const absl::string_view name = fields[1];
    if (name.size() > kMaxNameLength) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the name has ", name.size(),
                                                     " characters; at most ", kMaxNameLength));
    }
    for (const char c : name) {
      if (!IsAllowedNameChar(c)) {
        // The character by its code: it may be one a log line cannot show.
        return absl::InvalidArgumentError(
            absl::StrCat(where, "the name has the character 0x",
                         absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2),
                         "; a name is made of letters, digits and . _ : @ / -"));
      }
    }
    auto principal = std::make_shared<Principal>();
    principal->id = absl::AsciiStrToLower(fields[0]);
    principal->name = std::string(name);
    for (absl::string_view model : absl::StrSplit(fields[2], ',', absl::SkipEmpty())) {
      if (model == "*") {
        principal->all_models = true;
      } else {
        principal->models.insert(std::string(model));
      }
    }
    bool seen[3] = {false, false, false};
    for (size_t i = 3; i < fields.size(); ++i) {
      RETURN_IF_ERROR(ParseOption(fields[i], where, seen, principal.get()));
    }
    if (!principal->all_models && principal->models.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "expected a comma-separated list of models or *, got '", fields[2], "'"));
    }
    for (const Entry& e : entries) {
      if (e.hash == entry.hash) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "the same token hash as entry '", e.principal->name, "'"));
      }
    }
    entry.principal = std::move(principal);
    entries.push_back(std::move(entry));
  }
  return entries;
}

absl::StatusOr<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::Open(
    const std::string& path, absl::Duration reload_interval, std::string unknown_token_note) {
  const std::string identity = FileIdentity(path);
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  auto entries = Parse(*text, path);
  if (!entries.ok()) return entries.status();
  auto auth = std::unique_ptr<TokenAuthenticator>(
      new TokenAuthenticator(path, reload_interval, std::move(unknown_token_note)));
  {
    absl::MutexLock lock(&auth->mu_);
    auth->entries_ = std::make_shared<const std::vector<Entry>>(*std::move(entries));
    auth->file_identity_ = identity;
    auth->seen_identity_ = identity;
  }
  auth->watcher_ = std::thread([a = auth.get()] { a->WatchLoop(); });
  return auth;
}

TokenAuthenticator::TokenAuthenticator(std::string path, absl::Duration reload_interval,
                                       std::string unknown_token_note)
    : path_(std::move(path)),
      reload_interval_(reload_interval),
      unknown_token_note_(std::move(unknown_token_note)) {}

TokenAuthenticator::~TokenAuthenticator() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
}

void TokenAuthenticator::WatchLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), reload_interval_)) return;
    }
    ReloadIfChanged();
  }
}

void TokenAuthenticator::ReloadIfChanged() {
  const std::string identity = FileIdentity(path_);
  {
    absl::MutexLock lock(&mu_);
    // Only a file that has not changed since the previous check is read: one
    // being written (truncated, then filled) is read once it is complete.
    const bool stable = identity == seen_identity_;
    seen_identity_ = identity;
    if (!stable || identity == file_identity_) return;
  }
  absl::StatusOr<std::string> text = ReadFile(path_);
  // Written while being read: read it again once it is stable.
  if (FileIdentity(path_) != identity) return;
  absl::StatusOr<std::vector<Entry>> entries =
      text.ok() ? Parse(*text, path_) : absl::StatusOr<std::vector<Entry>>(text.status());
  absl::MutexLock lock(&mu_);
  file_identity_ = identity;  // A broken file is reported once, not every interval.
  if (!entries.ok()) {
    std::cerr << "auth tokens: reload failed, keeping the previous " << entries_->size()
              << " token(s): " << entries.status().message() << "\n";
    return;
  }
  if (entries->empty()) {
    std::cerr << "auth tokens: " << path_ << " holds no token (unchanged for two checks): "
              << "every token is revoked\n";
  }
  entries_ = std::make_shared<const std::vector<Entry>>(*std::move(entries));
  std::cerr << "auth tokens: reloaded " << entries_->size() << " token(s) from " << path_ << "\n";
}

size_t TokenAuthenticator::size() const {
  absl::MutexLock lock(&mu_);
  return entries_->size();
}

absl::StatusOr<std::shared_ptr<const Principal>> TokenAuthenticator::Authenticate(
    const absl::string_view* authorization) const {
  if (authorization == nullptr) {
    return absl::UnauthenticatedError(
        absl::StrCat("authorization: missing; send the metadata 'authorization: Bearer <token>' ",
                     kHowClientsSendIt));
  }
  absl::string_view value = absl::StripAsciiWhitespace(*authorization);
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() || !absl::StartsWithIgnoreCase(value, kScheme)) {
    return absl::UnauthenticatedError(
        "authorization: expected 'Bearer <token>', got another scheme or an empty token");
  }
  const Sha256 hash = Hash(absl::StripLeadingAsciiWhitespace(value.substr(kScheme.size())));
  std::shared_ptr<const std::vector<Entry>> entries;
  {
    absl::MutexLock lock(&mu_);
    entries = entries_;
  }
  // Every entry is compared, in constant time, whatever matches.
  const Entry* match = nullptr;
  for (const Entry& e : *entries) {
    const bool equal = CRYPTO_memcmp(e.hash.data(), hash.data(), hash.size()) == 0;
    match = equal ? &e : match;
  }
  if (match == nullptr) {
    return absl::UnauthenticatedError(absl::StrCat(
        "authorization: unknown token (its SHA-256 is in no line of the server's "
        "--auth_tokens_file)",
        unknown_token_note_.empty() ? "" : absl::StrCat(" (", unknown_token_note_, ")"),
        "; check the token the client sends ", kHowClientsSendIt));
  }
  return match->principal;
}

}  // namespace attention::server
