// File: client/cli/call_advice.h
//
// CallAdvice: what to do about a failed call, for the common mistakes whose
// raw gRPC text says little: a plaintext client against a TLS server ("Socket
// closed") or the reverse, a client certificate the server refuses, a server
// certificate the client does not trust, and a message over either side's
// size limit (naming --max_message_bytes), nothing listening at the target
// (naming --server), a missing or refused token (naming --token_file and
// ATTENTION_TOKEN) and a deadline passed (naming --deadline_ms and its value).
// The TLS and connection hints come from one probe: a plain TCP connection
// that sends the HTTP/2 preface and reads what comes back, made only after a
// call failed to connect. The Python and Node.js clients give the same hints.
// Stateless; thread-safe.
#ifndef ATTENTION_CLIENT_CLI_CALL_ADVICE_H_
#define ATTENTION_CLIENT_CLI_CALL_ADVICE_H_

#include <cstdint>
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
    bool token = false;               // It sent a bearer token (--token_file, ATTENTION_TOKEN).
    int64_t deadline_ms = 0;          // Its deadline (--deadline_ms); 0: not known.
  };

  // What listens at host:port: kHttp2 (it answered the preface with a
  // SETTINGS frame: a plaintext gRPC server), kTls (a TLS record, or a hang-up
  // without a byte: a TLS server refusing plaintext), kNothing (the
  // connection was refused: nothing listens there), or kUnknown (no
  // connection within timeout_ms, or no answer).
  enum class Listener { kUnknown, kHttp2, kTls, kNothing };
  static Listener Probe(const std::string& host, int port, int timeout_ms = 1000);

  // The hint for a call that failed with `code` (a grpc::StatusCode value)
  // and `details`, or "" when there is none to give. May probe the target
  // (up to a second) for UNAVAILABLE connection failures.
  static std::string For(int code, const std::string& details, const Call& call);

  // The whole report of a failed call of `method` ("GetModel", "Infer", ...):
  // "<method> failed: <CODE>: <details>", then "\n  hint: <hint>" when For
  // has one. When nothing listens at the target, the details become "cannot
  // connect to <host:port> (connection refused)" instead of gRPC's text.
  static std::string Describe(const std::string& method, int code, const std::string& details,
                              const Call& call);

  // The same report led by `lead` instead of "<method> failed" (e.g.
  // "infer: cannot read model 'demo'").
  static std::string DescribeAs(const std::string& lead, int code, const std::string& details,
                                const Call& call);
};

}  // namespace attention::client

#endif  // ATTENTION_CLIENT_CLI_CALL_ADVICE_H_
