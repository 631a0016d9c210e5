// File: server/frontends/rest/rest_client_ca.h
//
// RestClientCa: the CA certificates the REST port verifies client
// certificates against (mutual TLS), re-read while serving, as gRPC's
// certificate provider re-reads --tls_client_ca_file. Each handshake
// (OpenSSL's ClientHello callback) checks the file's mtime at most once a
// second, parses a changed file, and gives the connection the CAs in force,
// for its verification and for the CA names it asks the client for. A file
// that does not parse (or holds no certificate) is logged and the previous
// CAs stay in force. Connections already open keep the CAs they were
// verified with; a TLS session is resumed only while the CAs that verified
// it are in force (a session id context per file read).
//
// Thread-safe. Owns the parsed CAs; must outlive the SSL_CTX it is
// installed on (Install).
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_CLIENT_CA_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_CLIENT_CA_H_

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

class RestClientCa {
 public:
  // Reads the CAs from `pem_file`. INVALID_ARGUMENT when it holds none.
  static absl::StatusOr<std::unique_ptr<RestClientCa>> Load(std::string pem_file);
  ~RestClientCa();

  RestClientCa(const RestClientCa&) = delete;
  RestClientCa& operator=(const RestClientCa&) = delete;

  // Makes every handshake on `ctx` require a client certificate signed by
  // the CAs in force.
  void Install(SSL_CTX* ctx);
  // CA files read since Load (the first included), for tests and logs.
  int64_t loaded() const;

 private:
  struct Cas;
  explicit RestClientCa(std::string pem_file);
  static int OnClientHello(SSL* ssl, int* alert, void* self);
  // Re-reads the file when its mtime changed (at most once a second).
  void Refresh();
  absl::Status Read() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string pem_file_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Cas> cas_ ABSL_GUARDED_BY(mu_);
  int64_t mtime_ns_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t loaded_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_CLIENT_CA_H_
