#include "server/frontends/grpc/reflection_service.h"

#include <google/protobuf/descriptor.pb.h>

#include <set>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "proto/codec/status_codes.h"
#include "server/requests/identifiers.h"

namespace attention::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::DescriptorPool;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;

// The services to list: `services` in order without repeats, then the two
// reflection services if missing.
std::vector<std::string> ServicesToList(std::vector<std::string> services) {
  services.push_back(grpc::reflection::v1::ServerReflection::service_full_name());
  services.push_back(grpc::reflection::v1alpha::ServerReflection::service_full_name());
  std::vector<std::string> listed;
  std::set<std::string> seen;
  for (std::string& name : services) {
    if (seen.insert(name).second) listed.push_back(std::move(name));
  }
  return listed;
}

// `file` and its transitive dependencies, each once, `file` first, as
// serialized FileDescriptorProtos.
std::vector<std::string> WithDependencies(const FileDescriptor* file) {
  std::vector<std::string> serialized;
  std::set<const FileDescriptor*> seen = {file};
  std::vector<const FileDescriptor*> pending = {file};
  while (!pending.empty()) {
    const FileDescriptor* f = pending.back();
    pending.pop_back();
    google::protobuf::FileDescriptorProto proto;
    f->CopyTo(&proto);
    serialized.push_back(proto.SerializeAsString());
    for (int i = 0; i < f->dependency_count(); ++i) {
      if (seen.insert(f->dependency(i)).second) pending.push_back(f->dependency(i));
    }
  }
  return serialized;
}

// Adds `file` and its transitive dependencies to `response` (a
// FileDescriptorResponse of either version), or returns `file`'s error.
template <typename FileDescriptorResponse>
absl::Status AddWithDependencies(const absl::StatusOr<const FileDescriptor*>& file,
                                 FileDescriptorResponse* response) {
  if (!file.ok()) return file.status();
  for (std::string& serialized : WithDependencies(*file)) {
    response->add_file_descriptor_proto(std::move(serialized));
  }
  return absl::OkStatus();
}

absl::StatusOr<const FileDescriptor*> FileByName(const DescriptorPool& pool,
                                                 const std::string& name) {
  const FileDescriptor* file = pool.FindFileByName(name);
  if (file == nullptr) return absl::NotFoundError(absl::StrCat("file not found: '", name, "'"));
  return file;
}

// Services, methods, messages (nested too), enums, their values, fields and
// extensions, by full name.
absl::StatusOr<const FileDescriptor*> FileContainingSymbol(const DescriptorPool& pool,
                                                           const std::string& symbol) {
  const FileDescriptor* file = pool.FindFileContainingSymbol(symbol);
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat("symbol not found: '", symbol, "'"));
  }
  return file;
}

absl::StatusOr<const Descriptor*> MessageType(const DescriptorPool& pool, const std::string& name) {
  const Descriptor* type = pool.FindMessageTypeByName(name);
  if (type == nullptr) {
    return absl::NotFoundError(absl::StrCat("message type not found: '", name, "'"));
  }
  return type;
}

absl::StatusOr<const FileDescriptor*> FileContainingExtension(const DescriptorPool& pool,
                                                              const std::string& type_name,
                                                              int number) {
  absl::StatusOr<const Descriptor*> type = MessageType(pool, type_name);
  if (!type.ok()) return type.status();
  const FieldDescriptor* extension = pool.FindExtensionByNumber(*type, number);
  if (extension == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("extension not found: number ", number, " of '", type_name, "'"));
  }
  return extension->file();
}

absl::StatusOr<std::vector<int>> ExtensionNumbers(const DescriptorPool& pool,
                                                  const std::string& type_name) {
  absl::StatusOr<const Descriptor*> type = MessageType(pool, type_name);
  if (!type.ok()) return type.status();
  std::vector<const FieldDescriptor*> extensions;
  pool.FindAllExtensions(*type, &extensions);
  std::vector<int> numbers;
  numbers.reserve(extensions.size());
  for (const FieldDescriptor* e : extensions) numbers.push_back(e->number());
  return numbers;
}

}  // namespace

// One ServerReflectionInfo stream. At most one operation is outstanding at a
// time (each starts from the previous one's reaction), so the reactions never
// run concurrently and need no lock; none blocks. Deleted in OnDone().
template <typename Service, typename Request, typename Response>
class ReflectionService<Service, Request, Response>::Reactor final
    : public grpc::ServerBidiReactor<Request, Response> {
 public:
  // Serves the stream's requests with `service`.
  explicit Reactor(const ReflectionService* service) : service_(service) {
    this->StartRead(&request_);
  }
  // Ends the stream at once with `refusal`.
  explicit Reactor(const grpc::Status& refusal) : service_(nullptr) { this->Finish(refusal); }

  void OnReadDone(bool ok) override {
    if (!ok) {  // Half-closed (or cancelled): every request has been answered.
      this->Finish(grpc::Status::OK);
      return;
    }
    response_ = service_->Answer(request_);
    // The request is not kept while the answer waits for a client that may
    // never read it (a large one would be held outside every budget).
    Request().Swap(&request_);
    this->StartWrite(&response_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {  // The client is gone.
      this->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    this->StartRead(&request_);
  }
  void OnDone() override { delete this; }

 private:
  const ReflectionService* const service_;
  Request request_;
  Response response_;
};

template <typename Service, typename Request, typename Response>
ReflectionService<Service, Request, Response>::ReflectionService(
    std::vector<std::string> services, Authenticate authenticate,
    const google::protobuf::DescriptorPool* pool)
    : services_(ServicesToList(std::move(services))),
      authenticate_(std::move(authenticate)),
      pool_(pool) {}

template <typename Service, typename Request, typename Response>
grpc::ServerBidiReactor<Request, Response>*
ReflectionService<Service, Request, Response>::ServerReflectionInfo(
    grpc::CallbackServerContext* context) {
  if (authenticate_) {
    const absl::Status allowed = authenticate_(context);
    if (!allowed.ok()) return new Reactor(wire::ToGrpcStatus(allowed));
  }
  return new Reactor(this);
}

template <typename Service, typename Request, typename Response>
Response ReflectionService<Service, Request, Response>::Answer(const Request& request) const {
  Response response;
  // Nothing a caller sends is echoed past the identifier limit: an oversized
  // request gets a short error (a response echoed it whole, twice, before).
  if (request.ByteSizeLong() > 4 * kMaxIdentifierBytes) {
    response.mutable_error_response()->set_error_code(
        static_cast<int>(absl::StatusCode::kInvalidArgument));
    response.mutable_error_response()->set_error_message(absl::StrCat(
        "request: ", request.ByteSizeLong(), " bytes; its host and names are limited to ",
        kMaxIdentifierBytes, " bytes each"));
    return response;
  }
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  absl::Status status;
  switch (request.message_request_case()) {
    case Request::kListServices:
      for (const std::string& name : services_) {
        response.mutable_list_services_response()->add_service()->set_name(name);
      }
      return response;
    case Request::kFileByFilename:
      status = AddWithDependencies(FileByName(*pool_, request.file_by_filename()),
                                   response.mutable_file_descriptor_response());
      break;
    case Request::kFileContainingSymbol:
      status = AddWithDependencies(FileContainingSymbol(*pool_, request.file_containing_symbol()),
                                   response.mutable_file_descriptor_response());
      break;
    case Request::kFileContainingExtension:
      status = AddWithDependencies(
          FileContainingExtension(*pool_, request.file_containing_extension().containing_type(),
                                  request.file_containing_extension().extension_number()),
          response.mutable_file_descriptor_response());
      break;
    case Request::kAllExtensionNumbersOfType: {
      absl::StatusOr<std::vector<int>> numbers =
          ExtensionNumbers(*pool_, request.all_extension_numbers_of_type());
      status = numbers.status();
      if (!numbers.ok()) break;
      auto* answer = response.mutable_all_extension_numbers_response();
      answer->set_base_type_name(request.all_extension_numbers_of_type());
      for (int number : *numbers) answer->add_extension_number(number);
      break;
    }
    default:
      status = absl::UnimplementedError(
          "the request sets none of the message_request kinds this server knows");
      break;
  }
  if (!status.ok()) {  // Replaces a file_descriptor_response begun (one oneof).
    response.mutable_error_response()->set_error_code(static_cast<int>(status.code()));
    response.mutable_error_response()->set_error_message(std::string(status.message()));
  }
  return response;
}

template class ReflectionService<grpc::reflection::v1::ServerReflection,
                                 grpc::reflection::v1::ServerReflectionRequest,
                                 grpc::reflection::v1::ServerReflectionResponse>;
template class ReflectionService<grpc::reflection::v1alpha::ServerReflection,
                                 grpc::reflection::v1alpha::ServerReflectionRequest,
                                 grpc::reflection::v1alpha::ServerReflectionResponse>;

}  // namespace attention::server
