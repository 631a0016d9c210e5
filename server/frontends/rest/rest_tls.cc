// File: server/frontends/rest/rest_tls.cc
#include "server/frontends/rest/rest_tls.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace attention::server {

absl::StatusOr<std::unique_ptr<RestTls>> RestTls::Load(const Files& files) {
  const bool reloading = !files.identity.empty();
  const std::string& cert = reloading ? files.identity : files.cert;
  const std::string& key = reloading ? files.identity : files.key;
  if (cert.empty() || key.empty()) return nullptr;
  auto tls = std::unique_ptr<RestTls>(new RestTls());
  namespace ssl = boost::asio::ssl;
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_server);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  boost::system::error_code ec;
  ctx->use_certificate_chain_file(cert, ec);
  if (!ec) ctx->use_private_key_file(key, ssl::context::pem, ec);
  const std::string& ca = files.client_ca;
  if (!ec && !ca.empty()) {
    // Re-read while serving, as gRPC's provider re-reads it.
    absl::StatusOr<std::unique_ptr<RestClientCa>> client_ca = RestClientCa::Load(ca);
    if (client_ca.ok()) {
      tls->client_ca_ = *std::move(client_ca);
      tls->client_ca_->Install(ctx->native_handle());
    } else {
      ec = boost::asio::error::invalid_argument;
    }
  }
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_port: cannot load the TLS certificate '", cert, "', key '", key, "'",
        ca.empty() ? std::string() : absl::StrCat(" or client CA '", ca, "'"), ": ", ec.message()));
  }
  if (reloading) {
    ASSIGN_OR_RETURN(tls->identity_, RestTlsIdentity::Load(files.identity));
    tls->identity_->Install(ctx->native_handle());
  }
  tls->context_ = std::move(ctx);
  return tls;
}

}  // namespace attention::server
