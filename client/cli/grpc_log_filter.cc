#include "client/cli/grpc_log_filter.h"

#include <grpc/support/log.h>

#include "proto/codec/grpc_log_line.h"

namespace attention::client {
namespace {

void Filter(gpr_log_func_args* args) {
  if (wire::IsHandshakeFailure(args->message != nullptr ? args->message : "")) return;
  wire::WriteAsGrpc(args);
}

}  // namespace

void FilterGrpcLog() { gpr_set_log_function(Filter); }

}  // namespace attention::client
