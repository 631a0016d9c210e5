// File: proto/codec/grpc_log_line.h
//
// What the server and the client share of gRPC's own log
// (gpr_set_log_function): writing a line as gRPC's default function does,
// and recognizing the raw line gRPC 1.51 writes for every failed TLS
// handshake ("Handshake failed with fatal error SSL_ERROR_SSL: ..."), which
// both route elsewhere (the server: one line of its own; the CLI: the call's
// own error names the cause). Stateless; thread-safe.
#ifndef ATTENTION_PROTO_CODEC_GRPC_LOG_LINE_H_
#define ATTENTION_PROTO_CODEC_GRPC_LOG_LINE_H_

#include <grpc/support/log.h>

#include "absl/strings/string_view.h"

namespace attention::wire {

// Writes `args` to stderr in gRPC's own format:
// "E1128 04:36:30.613932921   17078 file.cc:1501] message".
void WriteAsGrpc(const gpr_log_func_args* args);

// True for gRPC's message of a failed TLS handshake.
bool IsHandshakeFailure(absl::string_view message);

}  // namespace attention::wire

#endif  // ATTENTION_PROTO_CODEC_GRPC_LOG_LINE_H_
