// File: client/cli/call_advice.h
//
// CallAdvice: what to do about a failed call, for the common mistakes whose
// raw gRPC text says little: a plaintext client against a TLS server ("Socket
// closed") or the reverse, a client certificate the server refuses, a server
// certificate the client does not trust, and a message over either side's
// size limit (naming --max_message_bytes). The TLS hints come from one probe:
// a plain TCP connection that sends the HTTP/2 preface and reads what comes
// back, made only after a call failed to connect. The Python and Node.js
// clients give the same hints. Stateless; thread-safe.
#ifndef ATTENTION_CLIENT_CLI_CALL_ADVICE_H_
#define ATTENTION_CLIENT_CLI_CALL_ADVICE_H_

#include <string>

namespace attention::client {

class CallAdvice {
 public:
  // How the failed call was made.
  struct Call {
    std::string target;               // --server.
    bool tls = false;                 // The channel used TLS.
    bool client_certificate = false;  // It presented one (--tls_cert_file).
    int max_message_bytes = 0;        // The client's limit (--max_message_bytes).
  };

  // What listens at host:port: kHttp2 (it answered the preface with a
  // SETTINGS frame: a plaintext gRPC server), kTls (a TLS record, or a hang-up
  // without a byte: a TLS server refusing plaintext), or kUnknown (no
  // connection or no answer within timeout_ms).
  enum class Listener { kUnknown, kHttp2, kTls };
  static Listener Probe(const std::string& host, int port, int timeout_ms = 1000);

  // The hint for a call that failed with `code` (a grpc::StatusCode value)
  // and `details`, or "" when there is none to give. May probe the target
  // (up to a second) for UNAVAILABLE connection failures.
  static std::string For(int code, const std::string& details, const Call& call);
};

}  // namespace attention::client

#endif  // ATTENTION_CLIENT_CLI_CALL_ADVICE_H_
