#include "tests/raw_http_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace attention::testing {

RawHttpConnection::RawHttpConnection(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const timeval timeout{20, 0};
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

RawHttpConnection::~RawHttpConnection() { close(fd_); }

bool RawHttpConnection::Send(const std::string& bytes) {
  for (size_t sent = 0; sent < bytes.size();) {
    const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

bool RawHttpConnection::ReadByte(char* c) { return recv(fd_, c, 1, 0) == 1; }

std::string RawHttpConnection::ReadUntil(const std::string& marker) {
  std::string out;
  char c;
  while (out.find(marker) == std::string::npos && recv(fd_, &c, 1, 0) == 1) out.push_back(c);
  return out;
}

std::string RawHttpConnection::ReadResponse() {
  std::string out = ReadUntil("\r\n\r\n");
  const size_t at = out.find("Content-Length: ");
  size_t left = at == std::string::npos ? 0 : std::strtoul(out.c_str() + at + 16, nullptr, 10);
  char buf[4096];
  for (ssize_t n; left > 0 && (n = recv(fd_, buf, std::min(left, sizeof(buf)), 0)) > 0;) {
    out.append(buf, n);
    left -= static_cast<size_t>(n);
  }
  return out;
}

std::string RawHttpConnection::ReadToEnd() {
  std::string out;
  char buf[16384];
  for (ssize_t n; (n = recv(fd_, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
  return out;
}

std::vector<int> HttpStatuses(const std::string& stream) {
  std::vector<int> out;
  for (size_t at = stream.find("HTTP/1.1 "); at != std::string::npos;
       at = stream.find("HTTP/1.1 ", at + 1)) {
    out.push_back(std::atoi(stream.c_str() + at + 9));
  }
  return out;
}

}  // namespace attention::testing
