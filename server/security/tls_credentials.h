// File: server/security/tls_credentials.h
//
// The gRPC port's transport security: plaintext (the default, for local use),
// TLS, or mutual TLS, from PEM files that are re-read while the server runs,
// so that a rotated Kubernetes Secret or cert-manager certificate takes effect
// without a restart. The key must match the certificate, at start-up and at
// every reload (TlsIdentityWatcher): a pair that does not is refused.
//
// Thread-safe (stateless). The ServerTransport returned owns the identity
// watcher, which must outlive the server using its credentials.
#ifndef ATTENTION_SERVER_SECURITY_TLS_CREDENTIALS_H_
#define ATTENTION_SERVER_SECURITY_TLS_CREDENTIALS_H_

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/security/tls_identity_watcher.h"

namespace attention::server {

struct TlsOptions {
  std::string cert_file;       // The server's certificate chain (PEM). Empty: plaintext.
  std::string key_file;        // Its private key (PEM).
  std::string client_ca_file;  // Set: mutual TLS; clients must present a certificate it signed.
  int reload_interval_s = 10;  // How often the files are checked for changes.

  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

// The gRPC port's credentials, and with TLS what keeps gRPC's identity a
// matching pair.
struct ServerTransport {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Null for plaintext. Must outlive the server built with `credentials`.
  std::unique_ptr<TlsIdentityWatcher> identity;
};

// Credentials for the gRPC port. INVALID_ARGUMENT for a key without a
// certificate (or the reverse), a client CA without a certificate, a file
// that is not PEM of the right kind, or a key that is not the certificate's
// (naming both files); NOT_FOUND for a file that cannot be read.
absl::StatusOr<ServerTransport> MakeServerTransport(const TlsOptions& options);

// "plaintext", "TLS" or "mutual TLS", for the start-up log.
std::string DescribeTransport(const TlsOptions& options);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SECURITY_TLS_CREDENTIALS_H_
