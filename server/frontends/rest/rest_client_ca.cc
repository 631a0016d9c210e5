// File: server/frontends/rest/rest_client_ca.cc
#include "server/frontends/rest/rest_client_ca.h"

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

// The CAs of one version of the file: the store client certificates are
// verified against, and their names (sent in the CertificateRequest).
struct RestClientCa::Cas {
  X509_STORE* store = X509_STORE_new();
  STACK_OF(X509_NAME) * names = sk_X509_NAME_new_null();
  // Which file read this is (1: Load's): a TLS session is resumed only
  // under the CAs that verified it (its session id context).
  int64_t generation = 0;
  ~Cas() {
    X509_STORE_free(store);
    sk_X509_NAME_pop_free(names, X509_NAME_free);
  }
};

namespace {

int64_t MtimeNs(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return -1;
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

RestClientCa::RestClientCa(std::string pem_file) : pem_file_(std::move(pem_file)) {}

RestClientCa::~RestClientCa() = default;

absl::StatusOr<std::unique_ptr<RestClientCa>> RestClientCa::Load(std::string pem_file) {
  auto ca = std::unique_ptr<RestClientCa>(new RestClientCa(std::move(pem_file)));
  absl::MutexLock lock(&ca->mu_);
  if (absl::Status read = ca->Read(); !read.ok()) return read;
  return ca;
}

absl::Status RestClientCa::Read() {
  const int64_t mtime = MtimeNs(pem_file_);
  std::ifstream in(pem_file_, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const std::string pem = text.str();
  auto cas = std::make_shared<Cas>();
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  int count = 0;
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(cas->store, cert);
    sk_X509_NAME_push(cas->names, X509_NAME_dup(X509_get_subject_name(cert)));
    X509_free(cert);
    ++count;
  }
  BIO_free(bio);
  ERR_clear_error();
  if (count == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("REST TLS: the client CA file '", pem_file_, "' holds no certificate"));
  }
  cas->generation = ++loaded_;
  cas_ = std::move(cas);
  mtime_ns_ = mtime;
  return absl::OkStatus();
}

void RestClientCa::Refresh() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - checked_ < absl::Seconds(1)) return;
  checked_ = now;
  const int64_t mtime = MtimeNs(pem_file_);
  if (mtime == mtime_ns_) return;
  if (absl::Status read = Read(); !read.ok()) {
    mtime_ns_ = mtime;  // Reported once per version of the file.
    std::cerr << read.message() << "; the REST port keeps the client CAs in force\n";
  }
}

int RestClientCa::OnClientHello(SSL* ssl, int* /*alert*/, void* self) {
  auto* ca = static_cast<RestClientCa*>(self);
  ca->Refresh();
  std::shared_ptr<const Cas> cas;
  {
    absl::MutexLock lock(&ca->mu_);
    cas = ca->cas_;
  }
  // This connection's own: a later file does not change a handshake under way.
  SSL_set1_verify_cert_store(ssl, cas->store);
  SSL_set_client_CA_list(ssl, SSL_dup_CA_list(cas->names));
  // OpenSSL refuses to resume a session (an "internal error" alert, not a
  // full handshake) when peers are verified and no session id context is
  // set; one per CA file read keeps sessions verified under older CAs from
  // being resumed (theirs is another: a full handshake).
  const std::string context = absl::StrCat("rest-client-ca-", cas->generation);
  SSL_set_session_id_context(ssl, reinterpret_cast<const unsigned char*>(context.data()),
                             static_cast<unsigned int>(context.size()));
  return SSL_CLIENT_HELLO_SUCCESS;
}

void RestClientCa::Install(SSL_CTX* ctx) {
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_client_hello_cb(ctx, &OnClientHello, this);
}

int64_t RestClientCa::loaded() const {
  absl::MutexLock lock(&mu_);
  return loaded_;
}

}  // namespace attention::server
