// File: server/frontends/rest/rest_tls_identity.h
//
// RestTlsIdentity: the REST port's TLS certificate chain and key, re-read
// while serving, as the gRPC port's are. It watches one PEM file holding the
// chain and then the key (TlsIdentityWatcher's in-memory copy, which only
// ever holds a matching pair, replaced in one step with a newer mtime): each
// TLS handshake (OpenSSL's certificate callback) checks the file's mtime at
// most once a second, parses a changed file, and hands the connection the
// pair in force. A file that does not parse, or whose key does not match,
// is logged and the previous pair stays in force. Connections already open
// keep the pair they were made with.
//
// Thread-safe. Owns the parsed pair; must outlive the SSL_CTX it is
// installed on (Install).
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_TLS_IDENTITY_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_TLS_IDENTITY_H_

#include <openssl/ssl.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attention::server {

class RestTlsIdentity {
 public:
  // Reads the pair from `pem_file`. INVALID_ARGUMENT when it does not parse
  // or the key is not the first certificate's.
  static absl::StatusOr<std::unique_ptr<RestTlsIdentity>> Load(std::string pem_file);
  ~RestTlsIdentity();

  RestTlsIdentity(const RestTlsIdentity&) = delete;
  RestTlsIdentity& operator=(const RestTlsIdentity&) = delete;

  // Makes every handshake on `ctx` use the pair in force.
  void Install(SSL_CTX* ctx);
  // Pairs read since Load (the first included), for tests and logs.
  int64_t loaded() const;

 private:
  struct Pair;
  explicit RestTlsIdentity(std::string pem_file);
  static int OnCertificate(SSL* ssl, void* self);
  // Re-reads the file when its mtime changed (at most once a second).
  void Refresh();
  absl::Status Read() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string pem_file_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Pair> pair_ ABSL_GUARDED_BY(mu_);
  int64_t mtime_ns_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t loaded_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_TLS_IDENTITY_H_
