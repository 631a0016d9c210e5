// File: tests/scale_out/gateway_process.h
//
// GatewayProcess: Debian's nginx or HAProxy, started by a test without
// privileges as the L7 gRPC gateway in front of attention-server replicas,
// running the reference configuration in deploy/ (deploy/nginx/attention.conf,
// deploy/haproxy/attention.cfg) with only its replica list, its listen
// address and the directives a test overrides replaced. Every file it
// writes (configuration, pid, logs, nginx's temp paths) is in its own
// folder under the test's temp dir. A second listener (HTTP/1.0, loopback)
// answers GET /generation with the number of the configuration loaded, so
// the test waits for a start or a reload to take effect instead of sleeping.
//
// Not thread-safe: one test thread drives it. The process is stopped by the
// destructor.
#ifndef ATTENTION_TESTS_SCALE_OUT_GATEWAY_PROCESS_H_
#define ATTENTION_TESTS_SCALE_OUT_GATEWAY_PROCESS_H_

#include <map>
#include <string>
#include <vector>

namespace attention::testing {

class GatewayProcess {
 public:
  enum class Kind { kNginx, kHaproxy };

  // The gateway's binary, or "" when it is not installed
  // (scripts/install_deps.sh installs both).
  static std::string Binary(Kind kind);

  // Starts `kind` in front of `backends` ("127.0.0.1:port" each), with each
  // directive of `overrides` (nginx: "client_body_timeout" -> "1s") given
  // that value instead of the reference's; waits (bounded, 30 s) until it
  // answers. Check ok(); error() says why not.
  GatewayProcess(Kind kind, const std::vector<std::string>& backends,
                 const std::map<std::string, std::string>& overrides = {});
  ~GatewayProcess();

  GatewayProcess(const GatewayProcess&) = delete;
  GatewayProcess& operator=(const GatewayProcess&) = delete;

  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  // "127.0.0.1:<port>": the one address clients reach.
  std::string target() const;
  // The configuration file it runs (for failure messages).
  const std::string& config_path() const { return config_; }

  // Lists `backends` instead and reloads (nginx: SIGHUP; HAProxy: SIGUSR2
  // to its master), then waits (bounded, 30 s) until new connections reach
  // the new configuration and the old worker has exited: connections open
  // at the reload finish their calls on the old configuration and are
  // closed with GOAWAY, and clients reconnect. False (error() says why) if
  // it did not take effect.
  bool Reload(const std::vector<std::string>& backends);

  // The gateway's own log (errors, reloads), for failure messages.
  std::string Log() const;

 private:
  // Writes the configuration of generation_ for `backends`.
  bool WriteConfig(const std::vector<std::string>& backends);
  bool AwaitGeneration();
  // The gateway's worker processes now (its master's children).
  int Workers() const;

  const Kind kind_;
  const std::map<std::string, std::string> overrides_;
  std::string dir_, config_, log_;
  int port_ = 0, status_port_ = 0, pid_ = -1, generation_ = 1;
  bool ok_ = false;
  std::string error_;
};

}  // namespace attention::testing

#endif  // ATTENTION_TESTS_SCALE_OUT_GATEWAY_PROCESS_H_
