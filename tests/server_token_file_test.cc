// TokenAuthenticator's token file (issue 21, item 8c): a file rewritten in
// place is never installed empty or half-written, and an empty file revokes
// only once it stays empty.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/token_authenticator.h"

namespace attention {
namespace {

using ::attention::server::TokenAuthenticator;

std::string HashHex(const std::string& token) {
  const TokenAuthenticator::Sha256 h = TokenAuthenticator::Hash(token);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(h.data()), 32));
}

std::string TestFile(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/token_file_test_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// write(2) all of `text` to `fd`.
void WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    ASSERT_GT(n, 0) << "write failed";
    done += static_cast<size_t>(n);
  }
}

bool Known(const TokenAuthenticator& auth, const std::string& token) {
  const std::string header = "Bearer " + token;
  const absl::string_view value = header;
  return auth.Authenticate(&value).ok();
}

// What a shell redirect of a slow command does (`vault ... > tokens`): the
// file is truncated, then written 40 ms later, a line at a time. Each state
// in between lasts less than one reload interval, so none is stable across
// two checks: no call with a valid token may be refused. (Before the fix the
// checker installed the empty and the one-line file as they were seen.)
TEST(TokenFileTest, FileRewrittenInPlaceNeverRevokesAValidToken) {
  const std::string path = TestFile("rewritten");
  const std::string alice = HashHex("alice-secret") + " alice *\n";
  const std::string bob = HashHex("bob-secret") + " bob *\n";
  WriteFile(path, alice + bob);
  auto auth = TokenAuthenticator::Open(path, absl::Milliseconds(200));
  ASSERT_TRUE(auth.ok()) << auth.status();
  ASSERT_EQ((*auth)->size(), 2u);

  std::atomic<bool> stop{false};
  std::atomic<int> calls{0}, refused{0};
  std::thread caller([&] {
    while (!stop.load()) {
      for (const char* token : {"alice-secret", "bob-secret"}) {
        calls.fetch_add(1);
        if (!Known(**auth, token)) refused.fetch_add(1);
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  for (int cycle = 0; cycle < 20; ++cycle) {
    const int fd = open(path.c_str(), O_WRONLY | O_TRUNC);
    ASSERT_GE(fd, 0);
    absl::SleepFor(absl::Milliseconds(40));
    WriteAll(fd, alice);
    absl::SleepFor(absl::Milliseconds(40));
    WriteAll(fd, bob);
    close(fd);
    absl::SleepFor(absl::Milliseconds(60));
  }
  stop.store(true);
  caller.join();
  EXPECT_GT(calls.load(), 0);
  EXPECT_EQ(refused.load(), 0) << "of " << calls.load()
                               << " calls with valid tokens while the file was rewritten";
  EXPECT_EQ((*auth)->size(), 2u);
}

// An empty file that stays empty is a deliberate revocation: after two
// checks no token is known.
TEST(TokenFileTest, FileThatStaysEmptyRevokesEveryToken) {
  const std::string path = TestFile("emptied");
  WriteFile(path, HashHex("alice-secret") + " alice *\n");
  auto auth = TokenAuthenticator::Open(path, absl::Milliseconds(20));
  ASSERT_TRUE(auth.ok()) << auth.status();
  ASSERT_TRUE(Known(**auth, "alice-secret"));
  WriteFile(path, "");
  const absl::Time end = absl::Now() + absl::Seconds(20);
  while (Known(**auth, "alice-secret") && absl::Now() < end) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_FALSE(Known(**auth, "alice-secret")) << "the empty file was never installed";
  EXPECT_EQ((*auth)->size(), 0u);
}

}  // namespace
}  // namespace attention
