#include "server/security/tls_credentials.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace attention::server {
namespace {

// Checks that `path` (given by `flag`) is readable and holds a PEM block
// whose label contains `kind` ("CERTIFICATE", "PRIVATE KEY").
absl::Status CheckPemFile(const std::string& flag, const std::string& path,
                          const std::string& kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  const std::string pem = text.str();
  const size_t begin = pem.find("-----BEGIN ");
  const size_t label_end = begin == std::string::npos ? begin : pem.find("-----", begin + 11);
  if (label_end == std::string::npos ||
      !absl::StrContains(pem.substr(begin + 11, label_end - begin - 11), kind)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", path, "' is not a PEM ", kind,
                                                   " (expected a '-----BEGIN ...", kind,
                                                   "-----' block)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string DescribeTransport(const TlsOptions& options) {
  if (!options.enabled()) return "plaintext";
  return options.client_ca_file.empty() ? "TLS" : "mutual TLS";
}

absl::StatusOr<ServerTransport> MakeServerTransport(const TlsOptions& options) {
  ServerTransport transport;
  if (!options.enabled()) {
    if (!options.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca_file: mutual TLS needs --tls_cert_file and --tls_key_file too");
    }
    transport.credentials = grpc::InsecureServerCredentials();
    return transport;
  }
  if (options.cert_file.empty()) {
    return absl::InvalidArgumentError("--tls_key_file is set but --tls_cert_file is not");
  }
  if (options.key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert_file is set but --tls_key_file is not");
  }
  if (options.reload_interval_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_reload_interval_s: expected >= 1, got ", options.reload_interval_s));
  }
  RETURN_IF_ERROR(CheckPemFile("--tls_cert_file", options.cert_file, "CERTIFICATE"));
  RETURN_IF_ERROR(CheckPemFile("--tls_key_file", options.key_file, "PRIVATE KEY"));
  const bool mutual = !options.client_ca_file.empty();
  if (mutual) {
    RETURN_IF_ERROR(CheckPemFile("--tls_client_ca_file", options.client_ca_file, "CERTIFICATE"));
  }
  // gRPC reads the identity from the watcher's in-memory copy, which holds
  // only pairs that match (the chain, then the key: one file for both), and
  // re-reads it every second; the watcher checks the files themselves every
  // --tls_reload_interval_s. The client CA is read by gRPC directly.
  ASSIGN_OR_RETURN(transport.identity,
                   TlsIdentityWatcher::Start(options.cert_file, options.key_file,
                                             absl::Seconds(options.reload_interval_s)));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      transport.identity->path(), transport.identity->path(), mutual ? options.client_ca_file : "",
      /*refresh_interval_sec=*/1);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (mutual) {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  transport.credentials = grpc::experimental::TlsServerCredentials(tls);
  return transport;
}

}  // namespace attention::server
