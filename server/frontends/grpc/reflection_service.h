// File: server/frontends/grpc/reflection_service.h
//
// gRPC server reflection, served by the project instead of gRPC's plugin
// (which in Debian's gRPC 1.51 speaks only grpc.reflection.v1alpha): one
// template answers both grpc.reflection.v1.ServerReflection and
// grpc.reflection.v1alpha.ServerReflection, whose messages are the same
// fields under two packages, so both versions give identical answers.
//
//   ReflectionServiceV1 v1(names, authenticate);
//   ReflectionServiceV1Alpha v1alpha(names, authenticate);
//   builder.RegisterService(&v1);
//   builder.RegisterService(&v1alpha);
//
// Each ServerReflectionInfo stream answers its requests one at a time, in
// order (read, answer, write, read ...), and finishes with OK when the
// client half-closes. Descriptors come from a DescriptorPool, by default the
// generated pool: every .proto whose generated code is linked into the
// server. A file is answered with its transitive dependencies (serialized
// FileDescriptorProtos, the requested file first, each file once).
//
// Thread-safe: the service is immutable after construction. `authenticate`
// (may be empty: reflection is open) and `pool` must outlive the service.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_REFLECTION_SERVICE_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_REFLECTION_SERVICE_H_

#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"

namespace attention::server {

// `Service` is the generated service class (its CallbackService is served),
// `Request` and `Response` its ServerReflectionRequest and
// ServerReflectionResponse.
template <typename Service, typename Request, typename Response>
class ReflectionService final : public Service::CallbackService {
 public:
  // Decides whether a call may use reflection (OK) or not (its error, which
  // ends the stream before any request is read).
  using Authenticate = std::function<absl::Status(const grpc::CallbackServerContext*)>;

  // `services`: the full names of the services the server registers, as
  // list_services answers them (in this order, without repeats; both
  // reflection services are added if missing).
  ReflectionService(std::vector<std::string> services, Authenticate authenticate,
                    const google::protobuf::DescriptorPool* pool =
                        google::protobuf::DescriptorPool::generated_pool());

  grpc::ServerBidiReactor<Request, Response>* ServerReflectionInfo(
      grpc::CallbackServerContext* context) override;

  // The answer to one request, as the stream writes it: valid_host and
  // original_request echo the request; then the services, the file (with its
  // dependencies) or the extension numbers; or error_response with NOT_FOUND
  // for an unknown file, symbol, type or extension, UNIMPLEMENTED for a
  // request of no known kind.
  Response Answer(const Request& request) const;

 private:
  class Reactor;

  const std::vector<std::string> services_;
  const Authenticate authenticate_;
  const google::protobuf::DescriptorPool* const pool_;
};

using ReflectionServiceV1 = ReflectionService<grpc::reflection::v1::ServerReflection,
                                              grpc::reflection::v1::ServerReflectionRequest,
                                              grpc::reflection::v1::ServerReflectionResponse>;
using ReflectionServiceV1Alpha =
    ReflectionService<grpc::reflection::v1alpha::ServerReflection,
                      grpc::reflection::v1alpha::ServerReflectionRequest,
                      grpc::reflection::v1alpha::ServerReflectionResponse>;

// Both are instantiated in reflection_service.cc.
extern template class ReflectionService<grpc::reflection::v1::ServerReflection,
                                        grpc::reflection::v1::ServerReflectionRequest,
                                        grpc::reflection::v1::ServerReflectionResponse>;
extern template class ReflectionService<grpc::reflection::v1alpha::ServerReflection,
                                        grpc::reflection::v1alpha::ServerReflectionRequest,
                                        grpc::reflection::v1alpha::ServerReflectionResponse>;

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_REFLECTION_SERVICE_H_
