// File: server/tls_credentials.h
//
// The gRPC port's transport security: plaintext (the default, for local use),
// TLS, or mutual TLS, from PEM files that are re-read while the server runs
// (gRPC's FileWatcherCertificateProvider), so that a rotated Kubernetes Secret
// or cert-manager certificate takes effect without a restart.
//
// Thread-safe (stateless); the credentials returned own their file watcher.
#ifndef ATTENTION_SERVER_TLS_CREDENTIALS_H_
#define ATTENTION_SERVER_TLS_CREDENTIALS_H_

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace attention::server {

struct TlsOptions {
  std::string cert_file;       // The server's certificate chain (PEM). Empty: plaintext.
  std::string key_file;        // Its private key (PEM).
  std::string client_ca_file;  // Set: mutual TLS; clients must present a certificate it signed.
  int reload_interval_s = 10;  // How often the files are checked for changes.

  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

// Credentials for the gRPC port. INVALID_ARGUMENT for a key without a
// certificate (or the reverse), a client CA without a certificate, or a file
// that is not PEM of the right kind; NOT_FOUND for a file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options);

// "plaintext", "TLS" or "mutual TLS", for the start-up log.
std::string DescribeTransport(const TlsOptions& options);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_TLS_CREDENTIALS_H_
