// File: server/accept_guard.h
//
// Keeps gRPC's listener alive when the process runs out of file
// descriptors. gRPC 1.51's listener (tcp_server_posix.cc) treats an accept4()
// that fails with anything but EAGAIN, EINTR or ECONNABORTED as the end of
// the port: it logs "Failed accept4: Too many open files" once and never
// accepts again, while the process runs on and its health stays SERVING on
// the connections it has. New clients then wait for a SETTINGS frame that
// never comes ("connection attempt timed out before receiving SETTINGS
// frame"). Later gRPC releases retry instead.
//
// InstallAcceptGuard() makes the server's own accept4() (which libgrpc calls
// in its place: the executable defines the symbol; its accept(), which REST's
// Asio acceptor calls, is the same) answer EMFILE and ENFILE
// itself: it frees a spare descriptor kept for the purpose, accepts each
// waiting connection and closes it at once (the client sees the connection
// closed instead of a silent wait), logs why (at most once a second, with
// the process's open descriptors and limit), takes the spare back, and
// reports EAGAIN so that gRPC keeps listening. Connections are accepted
// again as soon as descriptors are free. It also raises the soft
// RLIMIT_NOFILE to the hard limit, so that the limit is reached only when
// it must be.
//
// Only binaries that call InstallAcceptGuard() (attention-server) link the
// replacement. Thread-safe: accept4() may be called from any thread.
#ifndef ATTENTION_SERVER_ACCEPT_GUARD_H_
#define ATTENTION_SERVER_ACCEPT_GUARD_H_

#include <cstdint>
#include <string>

namespace attention::server {

// Raises the soft open-file limit to the hard one and keeps a spare
// descriptor; returns a line for the log ("file descriptors: limit N ...").
// Call once, early in main().
std::string InstallAcceptGuard();

// Connections refused so far because no descriptor was left.
int64_t ConnectionsRefusedForDescriptors();

}  // namespace attention::server

#endif  // ATTENTION_SERVER_ACCEPT_GUARD_H_
