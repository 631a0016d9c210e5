// File: server/security/tls_identity_watcher.h
//
// Hands gRPC the server's TLS identity (certificate chain and private key)
// only as a matching pair. gRPC's FileWatcherCertificateProvider (gRPC 1.51)
// installs whatever it reads, so a key that does not match its certificate
// would be served and every handshake would fail. Instead, this watcher
// checks the server's PEM files every interval; a pair whose key matches the
// public key of the chain's first certificate (X509_check_private_key) is
// copied into an in-memory file (memfd) that gRPC's provider watches
// (path()); a pair that does not is reported on stderr and gRPC keeps the
// previous one. The copy holds the chain, then the key, and gRPC is given it
// as both its key and its certificate file: a copy is replaced in one step
// (dup2) with a newer mtime, so gRPC (which checks each file's mtime before
// and after reading) never pairs a key and a certificate of two versions.
//
//   ASSIGN_OR_RETURN(auto watcher, TlsIdentityWatcher::Start(cert, key, absl::Seconds(10)));
//   FileWatcherCertificateProvider provider(watcher->path(), watcher->path(), "", 1);
//
// Thread-safe. Owns its thread (joined by the destructor) and the memfd; it
// must outlive the gRPC server whose credentials read path().
#ifndef ATTENTION_SERVER_SECURITY_TLS_IDENTITY_WATCHER_H_
#define ATTENTION_SERVER_SECURITY_TLS_IDENTITY_WATCHER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attention::server {

class TlsIdentityWatcher {
 public:
  // Reads the pair, checks it and starts watching. NOT_FOUND naming the flag
  // for a file that cannot be read; INVALID_ARGUMENT naming both files when
  // the key does not match the certificate (or either does not parse);
  // INTERNAL when the in-memory copy cannot be made.
  static absl::StatusOr<std::unique_ptr<TlsIdentityWatcher>> Start(std::string cert_file,
                                                                   std::string key_file,
                                                                   absl::Duration interval);

  // OK if `key_pem` is the private key of the first certificate of
  // `cert_pem`; INVALID_ARGUMENT naming `cert_file` and `key_file` otherwise.
  static absl::Status CheckPair(const std::string& cert_pem, const std::string& key_pem,
                                const std::string& cert_file, const std::string& key_file);

  ~TlsIdentityWatcher();
  TlsIdentityWatcher(const TlsIdentityWatcher&) = delete;
  TlsIdentityWatcher& operator=(const TlsIdentityWatcher&) = delete;

  // "/proc/self/fd/N": the pair in force, the chain then the key (PEM).
  const std::string& path() const { return path_; }
  // Changed pairs installed, and refused, since Start (for tests and logs).
  int64_t installed() const;
  int64_t refused() const;

 private:
  TlsIdentityWatcher(std::string cert_file, std::string key_file, absl::Duration interval, int fd);
  // Reads both files; installs a changed pair that matches, reports one that
  // does not (once per version of the files).
  void Check();
  // Writes `pem` into a new memfd with an mtime after the previous one's and
  // puts it in place of fd_. INTERNAL on failure.
  absl::Status Install(const std::string& pem);
  void Loop();

  const std::string cert_file_;
  const std::string key_file_;
  const absl::Duration interval_;
  const int fd_;  // The memfd gRPC reads through path_.
  const std::string path_;

  mutable absl::Mutex mu_;
  std::string served_ ABSL_GUARDED_BY(mu_);   // The files' contents of the pair in force.
  std::string refused_ ABSL_GUARDED_BY(mu_);  // The contents last refused (reported once).
  int64_t last_mtime_s_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t installed_count_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_count_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SECURITY_TLS_IDENTITY_WATCHER_H_
