#include "tests/server_test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <fstream>
#include <thread>

#include <sstream>

#include "absl/strings/match.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "proto/codec/tensor_codec.h"

namespace attention::testing {

void ToProto(const Tensor& t, v1::Tensor* out) { wire::EncodeTensor(t, out); }

Tensor FromProto(const v1::Tensor& t) {
  return wire::DecodeTensorCopy(t, "tensor")->ConvertTo(DType::kFloat32);
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string HttpGet(int port, const std::string& path, const std::string& host) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    close(fd);
    return "";
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request =
      "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
  if (write(fd, request.data(), request.size()) < 0) {
    close(fd);
    return "";
  }
  std::string response;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

double MetricValue(const std::string& exposition, const std::string& name,
                   const std::vector<std::string>& must_contain) {
  std::istringstream lines(exposition);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (!absl::StartsWith(line, name + "{") && !absl::StartsWith(line, name + " ")) continue;
    bool all = true;
    for (const std::string& m : must_contain) all &= absl::StrContains(line, m);
    if (!all) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

ServerProcess::ServerProcess(const std::string& binary, const std::vector<std::string>& extra_args,
                             const std::string& host, int port, const ServerProcessOptions& options)
    : host_(host) {
  port_ = port > 0 ? port : FreePort();
  metrics_port_ = FreePort();
  http_port_ = FreePort();
  std::vector<std::string> args = {binary, "--host=" + host_, "--port=" + std::to_string(port_),
                                   "--metrics_port=" + std::to_string(metrics_port_),
                                   "--http_port=" + std::to_string(http_port_)};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  pid_ = fork();
  if (pid_ == 0) {
    if (!options.stderr_path.empty()) {
      const int fd = open(options.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || dup2(fd, STDERR_FILENO) < 0) _exit(126);
      close(fd);
    }
    if (options.max_open_files > 0) {
      const rlimit limit = {static_cast<rlim_t>(options.max_open_files),
                            static_cast<rlim_t>(options.max_open_files)};
      if (setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(126);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  for (int i = 0; i < 300 && !ready_; ++i) {  // Up to 30 s.
    // A new channel each time: one whose first connection was refused
    // before the server listened backs off for seconds before trying again.
    auto channel = grpc::CreateChannel(target(), grpc::InsecureChannelCredentials());
    auto health = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    grpc::health::v1::HealthCheckResponse resp;
    ready_ = health->Check(&ctx, {}, &resp).ok() &&
             resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
    if (!ready_) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

void ServerProcess::Kill() {
  if (pid_ > 0) kill(pid_, SIGKILL);
  Wait();
}

void ServerProcess::Terminate() {
  if (pid_ > 0) kill(pid_, SIGTERM);
}

int ServerProcess::Wait() {
  if (pid_ <= 0) return -1;
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int ServerProcess::Stop() {
  Terminate();
  return Wait();
}

int RunCommand(const std::string& command, std::string* output) {
  output->clear();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output->append(buf, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int64_t ProcStatusBytes(int pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) {
      std::istringstream fields(line.substr(field.size()));
      int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return -1;
}

}  // namespace attention::testing
