// File: tests/test_certificates.h
//
// Certificates for the TLS tests, made at test time with the openssl command
// line tool: two CAs, server certificates for localhost/127.0.0.1 signed by
// each, and client certificates signed by each. Nothing is committed.
#ifndef ATTENTION_TESTS_TEST_CERTIFICATES_H_
#define ATTENTION_TESTS_TEST_CERTIFICATES_H_

#include <fstream>
#include <sstream>
#include <string>

#include "tests/server_test_util.h"

namespace attention::testing {

class TestCertificates {
 public:
  // Makes every file under `dir` (created). Check ok() and error().
  explicit TestCertificates(const std::string& dir) : dir_(dir) {
    std::string out;
    const std::string script =
        "set -e; mkdir -p '" + dir + "'; cd '" + dir +
        "'; "
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > server.ext; "
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext; "
        "for ca in ca1 ca2; do "
        "  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "    -keyout $ca.key -out $ca.pem -days 2 -subj /CN=attention-test-$ca; "
        "  for who in server client; do "
        "    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "      -keyout $who-$ca.key -out $who-$ca.csr -subj /CN=localhost; "
        "    openssl x509 -req -in $who-$ca.csr -CA $ca.pem -CAkey $ca.key -CAcreateserial "
        "      -out $who-$ca.pem -days 2 -extfile $who.ext; "
        "  done; "
        "done";
    ok_ = RunCommand("{ " + script + "; }", &out) == 0;
    error_ = out;
  }

  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  // "<dir>/<name>", e.g. Path("server-ca1.pem").
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  // The contents of Path(name).
  std::string Read(const std::string& name) const {
    std::ifstream in(Path(name), std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  std::string dir_;
  bool ok_ = false;
  std::string error_;
};

}  // namespace attention::testing

#endif  // ATTENTION_TESTS_TEST_CERTIFICATES_H_
