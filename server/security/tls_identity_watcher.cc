#include "server/security/tls_identity_watcher.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace attention::server {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// OpenSSL's oldest queued error, as text; clears the queue.
std::string TakeOpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no OpenSSL error";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

// A password callback that gives none: an encrypted key fails to load
// instead of prompting on the terminal.
int NoPassword(char*, int, int, void*) { return 0; }

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

// The two files' contents as one key for "changed since".
std::string Contents(const std::string& cert_pem, const std::string& key_pem) {
  return absl::StrCat(cert_pem.size(), ":", cert_pem, key_pem);
}

}  // namespace

absl::Status TlsIdentityWatcher::CheckPair(const std::string& cert_pem, const std::string& key_pem,
                                           const std::string& cert_file,
                                           const std::string& key_file) {
  std::unique_ptr<BIO, BioFree> cert_bio(
      BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
  std::unique_ptr<BIO, BioFree> key_bio(
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
  if (cert_bio == nullptr || key_bio == nullptr) {
    return absl::ResourceExhaustedError("TLS: out of memory reading the certificate and key");
  }
  std::unique_ptr<X509, X509Free> cert(
      PEM_read_bio_X509(cert_bio.get(), nullptr, NoPassword, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_cert_file: '", cert_file,
                                                   "' holds no certificate OpenSSL can read (",
                                                   TakeOpenSslError(), ")"));
  }
  std::unique_ptr<EVP_PKEY, PkeyFree> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, NoPassword, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key_file: '", key_file,
                     "' holds no private key OpenSSL can read (an encrypted key is not "
                     "supported): ",
                     TakeOpenSslError()));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key_file: '", key_file, "' is not the private key of the certificate in ",
        "--tls_cert_file '", cert_file, "' (", TakeOpenSslError(), ")"));
  }
  ERR_clear_error();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TlsIdentityWatcher>> TlsIdentityWatcher::Start(
    std::string cert_file, std::string key_file, absl::Duration interval) {
  absl::StatusOr<std::string> cert = ReadFile("--tls_cert_file", cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile("--tls_key_file", key_file);
  if (!key.ok()) return key.status();
  absl::Status pair = CheckPair(*cert, *key, cert_file, key_file);
  if (!pair.ok()) return pair;
  const int fd = memfd_create("attention-tls-identity", MFD_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("TLS: memfd_create for the identity copy failed: ", std::strerror(errno)));
  }
  auto watcher = std::unique_ptr<TlsIdentityWatcher>(
      new TlsIdentityWatcher(std::move(cert_file), std::move(key_file), interval, fd));
  absl::Status installed = watcher->Install(*cert + "\n" + *key);
  if (!installed.ok()) return installed;
  {
    absl::MutexLock lock(&watcher->mu_);
    watcher->served_ = Contents(*cert, *key);
  }
  watcher->thread_ = std::thread([w = watcher.get()] { w->Loop(); });
  return watcher;
}

TlsIdentityWatcher::TlsIdentityWatcher(std::string cert_file, std::string key_file,
                                       absl::Duration interval, int fd)
    : cert_file_(std::move(cert_file)),
      key_file_(std::move(key_file)),
      interval_(interval),
      fd_(fd),
      path_(absl::StrCat("/proc/self/fd/", fd)) {}

TlsIdentityWatcher::~TlsIdentityWatcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  close(fd_);
}

int64_t TlsIdentityWatcher::installed() const {
  absl::MutexLock lock(&mu_);
  return installed_count_;
}

int64_t TlsIdentityWatcher::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_count_;
}

absl::Status TlsIdentityWatcher::Install(const std::string& pem) {
  const int fd = memfd_create("attention-tls-identity", MFD_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("TLS: memfd_create for the identity copy failed: ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < pem.size()) {
    const ssize_t n = write(fd, pem.data() + done, pem.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      close(fd);
      return absl::InternalError(absl::StrCat("TLS: writing the identity copy failed: ", why));
    }
    done += static_cast<size_t>(n);
  }
  // gRPC compares mtimes in whole seconds: each copy's is a later second.
  absl::MutexLock lock(&mu_);
  const int64_t mtime_s = std::max(absl::ToUnixSeconds(absl::Now()), last_mtime_s_ + 1);
  const struct timespec times[2] = {{static_cast<time_t>(mtime_s), 0},
                                    {static_cast<time_t>(mtime_s), 0}};
  if (futimens(fd, times) != 0 || dup3(fd, fd_, O_CLOEXEC) < 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return absl::InternalError(absl::StrCat("TLS: replacing the identity copy failed: ", why));
  }
  close(fd);
  last_mtime_s_ = mtime_s;
  return absl::OkStatus();
}

void TlsIdentityWatcher::Check() {
  absl::StatusOr<std::string> cert = ReadFile("--tls_cert_file", cert_file_);
  absl::StatusOr<std::string> key = ReadFile("--tls_key_file", key_file_);
  const std::string contents =
      cert.ok() && key.ok() ? Contents(*cert, *key) : std::string("unreadable");
  {
    absl::MutexLock lock(&mu_);
    if (contents == served_ || contents == refused_) return;
  }
  absl::Status status = !cert.ok()  ? cert.status()
                        : !key.ok() ? key.status()
                                    : CheckPair(*cert, *key, cert_file_, key_file_);
  if (status.ok()) status = Install(*cert + "\n" + *key);
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    refused_ = contents;  // Reported once, not every interval.
    ++refused_count_;
    std::cerr << "TLS: " << status.message()
              << "; the certificate and key in force stay (checked again when the files "
                 "change)\n";
    return;
  }
  served_ = contents;
  refused_.clear();
  ++installed_count_;
  std::cerr << "TLS: serving the new certificate and key from " << cert_file_ << " and "
            << key_file_ << "\n";
}

void TlsIdentityWatcher::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), interval_)) return;
    }
    Check();
  }
}

}  // namespace attention::server
