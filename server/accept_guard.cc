#include "server/accept_guard.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace attention::server {
namespace {

using Accept4 = int (*)(int, sockaddr*, socklen_t*, int);

std::atomic<bool> g_installed{false};
std::atomic<int64_t> g_refused{0};
std::atomic<int64_t> g_last_log_s{0};
// The spare descriptor; -1 while it is lent out or could not be taken back.
std::mutex g_spare_mu;
int g_spare = -1;

Accept4 RealAccept4() {
  static const Accept4 real = reinterpret_cast<Accept4>(dlsym(RTLD_NEXT, "accept4"));
  return real;
}

int OpenSpare() { return open("/dev/null", O_RDONLY | O_CLOEXEC); }

int64_t OpenDescriptors() {
  int64_t n = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (readdir(dir) != nullptr) ++n;
    closedir(dir);
    n -= 3;  // ".", ".." and the directory's own descriptor.
  }
  return n;
}

// Logs a refusal, at most once a second (no allocation beyond the line).
void LogRefusal(int error) {
  const int64_t now = time(nullptr);
  int64_t last = g_last_log_s.load();
  if (now == last || !g_last_log_s.compare_exchange_strong(last, now)) return;
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  std::fprintf(stderr,
               "refused a connection: no file descriptor left to accept it (%s; %lld open, limit "
               "%llu; %lld refused so far); raise the limit (ulimit -n, --ulimit nofile=) or "
               "spread the clients over more replicas\n",
               error == ENFILE ? "the system's table is full" : "Too many open files",
               static_cast<long long>(OpenDescriptors()),
               static_cast<unsigned long long>(limit.rlim_cur),
               static_cast<long long>(g_refused.load()));
}

// With no descriptor left: lends the spare to accept one waiting connection
// and close it. True if one was closed; false if none waits or even the
// spare could not make room (another thread took it).
bool RefuseOne(int listener, Accept4 real, int error) {
  std::lock_guard<std::mutex> lock(g_spare_mu);
  if (g_spare < 0) g_spare = OpenSpare();  // Retaken if descriptors freed up.
  if (g_spare < 0) return false;
  close(g_spare);
  g_spare = -1;
  // Retried when interrupted or when the client gave up (the listener is
  // edge-triggered: returning EAGAIN with connections still queued would
  // leave them waiting for the next client's wake-up).
  int connection;
  do {
    connection = real(listener, nullptr, nullptr, SOCK_CLOEXEC);
  } while (connection < 0 && (errno == EINTR || errno == ECONNABORTED));
  if (connection >= 0) {
    close(connection);
    g_refused.fetch_add(1);
    LogRefusal(error);  // While the spare's descriptor is free to count with.
  }
  g_spare = OpenSpare();
  return connection >= 0;
}

}  // namespace

std::string InstallAcceptGuard() {
  rlimit limit{};
  std::string line;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    const rlim_t soft = limit.rlim_cur;
    if (limit.rlim_cur < limit.rlim_max) {
      limit.rlim_cur = limit.rlim_max;
      if (setrlimit(RLIMIT_NOFILE, &limit) != 0) limit.rlim_cur = soft;
    }
    line = absl::StrCat("file descriptors: limit ", limit.rlim_cur,
                        limit.rlim_cur != soft ? absl::StrCat(" (raised from ", soft, ")") : "",
                        "; past it new connections are closed at once, and logged");
  }
  {
    std::lock_guard<std::mutex> lock(g_spare_mu);
    if (g_spare < 0) g_spare = OpenSpare();
  }
  RealAccept4();  // Resolved now, not on the first connection.
  g_installed.store(true);
  return line;
}

int64_t ConnectionsRefusedForDescriptors() { return g_refused.load(); }

}  // namespace attention::server

// gRPC's listener calls this in place of libc's (the executable's symbol
// comes first). Until InstallAcceptGuard() it is libc's, unchanged.
extern "C" int accept4(int listener, sockaddr* address, socklen_t* length, int flags) {
  using attention::server::g_installed;
  const attention::server::Accept4 real = attention::server::RealAccept4();
  while (true) {
    const int connection = real(listener, address, length, flags);
    if (connection >= 0 || !g_installed.load(std::memory_order_relaxed) ||
        (errno != EMFILE && errno != ENFILE)) {
      return connection;
    }
    if (!attention::server::RefuseOne(listener, real, errno)) {
      errno = EAGAIN;  // Nothing waits, or no room even to refuse: listen on.
      return -1;
    }
  }
}

// The same for callers of accept() (REST's Asio acceptor, which retried an
// EMFILE at once, spinning, with the connections left queued unanswered).
extern "C" int accept(int listener, sockaddr* address, socklen_t* length) {
  return accept4(listener, address, length, 0);
}
