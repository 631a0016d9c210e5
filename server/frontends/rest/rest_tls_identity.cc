// File: server/frontends/rest/rest_tls_identity.cc
#include "server/frontends/rest/rest_tls_identity.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace attention::server {

struct RestTlsIdentity::Pair {
  X509* leaf = nullptr;
  STACK_OF(X509) * chain = nullptr;  // The certificates after the leaf.
  EVP_PKEY* key = nullptr;
  ~Pair() {
    X509_free(leaf);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(key);
  }
};

namespace {

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();  // NOLINT(runtime/int): OpenSSL's type.
  ERR_clear_error();
  if (e == 0) return "no detail";
  char text[256];
  ERR_error_string_n(e, text, sizeof(text));
  return text;
}

int64_t MtimeNs(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return -1;
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

RestTlsIdentity::RestTlsIdentity(std::string pem_file) : pem_file_(std::move(pem_file)) {}

RestTlsIdentity::~RestTlsIdentity() = default;

absl::StatusOr<std::unique_ptr<RestTlsIdentity>> RestTlsIdentity::Load(std::string pem_file) {
  auto identity = std::unique_ptr<RestTlsIdentity>(new RestTlsIdentity(std::move(pem_file)));
  absl::MutexLock lock(&identity->mu_);
  if (absl::Status read = identity->Read(); !read.ok()) return read;
  return identity;
}

absl::Status RestTlsIdentity::Read() {
  const int64_t mtime = MtimeNs(pem_file_);
  std::ifstream in(pem_file_, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const std::string pem = text.str();
  if (!in || pem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("REST TLS: cannot read '", pem_file_, "'"));
  }
  auto read_bio = [&pem] { return BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())); };
  auto pair = std::make_shared<Pair>();
  BIO* certs = read_bio();
  pair->leaf = PEM_read_bio_X509(certs, nullptr, nullptr, nullptr);
  pair->chain = sk_X509_new_null();
  if (pair->leaf != nullptr) {
    // PEM readers skip objects of other kinds: the key block ends the loop.
    while (X509* next = PEM_read_bio_X509(certs, nullptr, nullptr, nullptr)) {
      sk_X509_push(pair->chain, next);
    }
    ERR_clear_error();
  }
  BIO_free(certs);
  BIO* keys = read_bio();
  pair->key = PEM_read_bio_PrivateKey(keys, nullptr, nullptr, nullptr);
  BIO_free(keys);
  if (pair->leaf == nullptr || pair->key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("REST TLS: '", pem_file_, "' lacks a ",
                                                   pair->leaf == nullptr ? "certificate" : "key",
                                                   " (", OpenSslError(), ")"));
  }
  if (X509_check_private_key(pair->leaf, pair->key) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("REST TLS: the key in '", pem_file_, "' is not its first certificate's"));
  }
  pair_ = std::move(pair);
  mtime_ns_ = mtime;
  ++loaded_;
  return absl::OkStatus();
}

void RestTlsIdentity::Refresh() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - checked_ < absl::Seconds(1)) return;
  checked_ = now;
  const int64_t mtime = MtimeNs(pem_file_);
  if (mtime == mtime_ns_) return;
  if (absl::Status read = Read(); !read.ok()) {
    mtime_ns_ = mtime;  // Reported once per version of the file.
    std::cerr << read.message() << "; the REST port keeps the pair in force\n";
  }
}

int RestTlsIdentity::OnCertificate(SSL* ssl, void* self) {
  auto* identity = static_cast<RestTlsIdentity*>(self);
  identity->Refresh();
  std::shared_ptr<const Pair> pair;
  {
    absl::MutexLock lock(&identity->mu_);
    pair = identity->pair_;
  }
  // override=1: replaces what the context set for this connection only.
  return SSL_use_cert_and_key(ssl, pair->leaf, pair->key, pair->chain, 1) == 1 ? 1 : 0;
}

void RestTlsIdentity::Install(SSL_CTX* ctx) { SSL_CTX_set_cert_cb(ctx, &OnCertificate, this); }

int64_t RestTlsIdentity::loaded() const {
  absl::MutexLock lock(&mu_);
  return loaded_;
}

}  // namespace attention::server
