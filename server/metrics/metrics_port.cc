#include "server/metrics/metrics_port.h"

#include <CivetServer.h>
#include <civetweb.h>

#include <cstring>
#include <string>

namespace attention::server {
namespace {

// Answers every path but /metrics (and below it) with a pointer to it.
int BeginRequest(mg_connection* connection) {
  const mg_request_info* info = mg_get_request_info(connection);
  const std::string uri = info != nullptr && info->local_uri != nullptr ? info->local_uri : "/";
  if (uri == "/metrics" || uri.rfind("/metrics/", 0) == 0) return 0;  // The Exposer's.
  const bool root = uri == "/";
  const std::string body =
      root ? "attention-server: this port serves Prometheus metrics at /metrics\n"
           : "not found: " + uri.substr(0, 200) +
                 "; this port serves Prometheus metrics at /metrics\n";
  const int status = root ? 200 : 404;
  mg_printf(connection,
            "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: %zu\r\nConnection: close\r\n\r\n",
            status, root ? "OK" : "Not Found", body.size());
  const bool head = info != nullptr && info->request_method != nullptr &&
                    std::strcmp(info->request_method, "HEAD") == 0;
  if (!head) mg_write(connection, body.data(), body.size());
  return status;
}

}  // namespace

const CivetCallbacks* MetricsPortCallbacks() {
  static const CivetCallbacks* const callbacks = [] {
    auto* c = new CivetCallbacks();
    c->begin_request = BeginRequest;
    return c;
  }();
  return callbacks;
}

}  // namespace attention::server
