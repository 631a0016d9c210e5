// File: client/cli/grpc_log_filter.h
//
// attention-client's routing of gRPC's own log: gRPC 1.51 writes a raw line
// ("E1128 ... ssl_transport_security.cc:1501] Handshake failed with fatal
// error SSL_ERROR_SSL: ...wrong version number") for every failed TLS
// handshake, several per call. The failed call's status carries the same
// SSL reason and the CLI prints it with a hint (call_advice.h), so those
// lines are dropped; every other gRPC line is written as gRPC writes it
// (same format; GRPC_VERBOSITY is applied by gRPC before the function).
//
// Thread-safe (gRPC calls the function from any thread); no state.
#ifndef ATTENTION_CLIENT_CLI_GRPC_LOG_FILTER_H_
#define ATTENTION_CLIENT_CLI_GRPC_LOG_FILTER_H_

namespace attention::client {

// Installs the filter (gpr_set_log_function). Call once, early in main().
void FilterGrpcLog();

}  // namespace attention::client

#endif  // ATTENTION_CLIENT_CLI_GRPC_LOG_FILTER_H_
