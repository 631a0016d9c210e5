// File: server/frontends/rest/rest_tls.h
//
// RestTls: the REST port's TLS context (Asio's ssl::context: TLS 1.2 and
// later) built from the server's files, with what keeps it current while
// serving: the identity file re-read as it rotates (RestTlsIdentity) and the
// client CA re-read as gRPC's provider re-reads it (RestClientCa).
//
// Thread-safe once loaded (the context is read by every handshake; the
// identity and CA swap under their own locks). Owns the context, the
// identity and the client CA; HttpServer borrows the context.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_TLS_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_TLS_H_

#include <memory>
#include <string>

#include <boost/asio/ssl/context.hpp>

#include "absl/status/statusor.h"
#include "server/frontends/rest/rest_client_ca.h"
#include "server/frontends/rest/rest_tls_identity.h"

namespace attention::server {

class RestTls {
 public:
  struct Files {
    std::string cert;  // PEM chain (with `key`), read once;
    std::string key;
    std::string client_ca;  // set: client certificates required (mutual TLS);
    std::string identity;   // or one PEM file of both, re-read as it changes.
  };
  // Null when no certificate is configured (plain HTTP); INVALID_ARGUMENT
  // naming the files when one cannot be read.
  static absl::StatusOr<std::unique_ptr<RestTls>> Load(const Files& files);

  boost::asio::ssl::context* context() const { return context_.get(); }

 private:
  RestTls() = default;
  std::unique_ptr<RestTlsIdentity> identity_;  // Null unless Files::identity.
  std::unique_ptr<RestClientCa> client_ca_;    // Null unless Files::client_ca.
  std::unique_ptr<boost::asio::ssl::context> context_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_TLS_H_
