// TokenAuthenticator's token file (issue 21, items 5 and 8c): a file rewritten
// in place is never installed empty or half-written, an empty file revokes
// only once it stays empty, names are refused unless they can be logged as
// they are, a principal is identified by its entry's hash, and parse errors
// name the line.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/security/token_authenticator.h"
#include "tests/fixture/token_files.h"

namespace attention {
namespace {

using ::attention::server::TokenAuthenticator;
using ::attention::testing::HashHex;
using ::testing::HasSubstr;

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

// Names end up in log lines and messages: only [A-Za-z0-9._:@/-], at most
// 128 characters; anything else is refused naming the line.
TEST(TokenFileTest, NamesOutsideTheAllowedSetAreRefused) {
  const std::string hash = HashHex("x");
  auto ok = TokenAuthenticator::Parse(hash + " svc.team-1_a:b@c/d *\n", "f");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0].principal->name, "svc.team-1_a:b@c/d");
  for (const std::string& name :
       {std::string("bad\x1b[2Kname"), std::string("nul\x01"), std::string("caf\xc3\xa9"),
        std::string("quote\"d"), std::string("semi;colon"), std::string("back\\slash")}) {
    auto parsed = TokenAuthenticator::Parse("# comment\n" + hash + " " + name + " *\n", "f");
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(parsed.status().message(), HasSubstr("f:2: the name has the character 0x")) << name;
    // The message itself never carries the character.
    EXPECT_THAT(parsed.status().message(), ::testing::Not(HasSubstr(name))) << name;
  }
  auto too_long = TokenAuthenticator::Parse(hash + " " + std::string(129, 'a') + " *\n", "f");
  EXPECT_THAT(too_long.status().message(), HasSubstr("f:1: the name has 129 characters"));
  EXPECT_TRUE(TokenAuthenticator::Parse(hash + " " + std::string(128, 'a') + " *\n", "f").ok());
}

// Two entries may share a name; each is its own principal, identified by its
// hash (what sessions and sequences are owned by).
TEST(TokenFileTest, PrincipalIdIsTheEntrysHash) {
  const std::string path = TestFile("ids");
  // Upper-case hex in the file: the id is lower-case all the same.
  WriteFile(path, absl::AsciiStrToUpper(HashHex("team-one")) + " team *\n" + HashHex("team-two") +
                      " team *\n");
  auto auth = TokenAuthenticator::Open(path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  const std::string one = "Bearer team-one", two = "Bearer team-two";
  const absl::string_view one_view = one, two_view = two;
  auto first = (*auth)->Authenticate(&one_view);
  auto second = (*auth)->Authenticate(&two_view);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ((*first)->name, (*second)->name);
  EXPECT_EQ((*first)->id, HashHex("team-one"));
  EXPECT_EQ((*second)->id, HashHex("team-two"));
  EXPECT_NE((*first)->id, (*second)->id);
}

TEST(TokenFileTest, ParseErrorsNameTheLine) {
  EXPECT_THAT(TokenAuthenticator::Parse("abc alice *\n", "f").status().message(),
              HasSubstr("f:1: expected a SHA-256 hash of 64 hex digits"));
  const std::string hash = HashHex("x");
  EXPECT_THAT(TokenAuthenticator::Parse("# c\n\n" + hash + " alice\n", "f").status().message(),
              HasSubstr("f:3: expected '<sha256 hex> <name> <models or *> [weight=N]"));
  EXPECT_THAT(TokenAuthenticator::Parse(hash + " a *\n" + hash + " b *\n", "f").status().message(),
              HasSubstr("f:2: the same token hash as entry 'a'"));
  auto parsed = TokenAuthenticator::Parse(hash + " a m1,m2\n", "f");
  ASSERT_TRUE(parsed.ok());
  ASSERT_EQ(parsed->size(), 1u);
  EXPECT_TRUE((*parsed)[0].principal->MayUse("m2"));
  EXPECT_FALSE((*parsed)[0].principal->MayUse("m3"));
}

// Optional fields after the models: weight=, rate=, token_rate=.
TEST(TokenFileTest, OptionsGiveWeightsAndRates) {
  const std::string a = HashHex("a"), b = HashHex("b"), c = HashHex("c");
  auto parsed = TokenAuthenticator::Parse(
      a + " alice * weight=3\n" + b + " bob demo rate=20 token_rate=65536\n" + c + " carol *\n",
      "f");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 3u);
  EXPECT_EQ((*parsed)[0].principal->weight, 3);
  EXPECT_EQ((*parsed)[0].principal->rate, 0);
  EXPECT_EQ((*parsed)[1].principal->weight, 1);
  EXPECT_EQ((*parsed)[1].principal->rate, 20);
  EXPECT_EQ((*parsed)[1].principal->token_rate, 65536);
  EXPECT_EQ((*parsed)[2].principal->weight, 1);
  EXPECT_EQ((*parsed)[2].principal->token_rate, 0);
  const std::pair<std::string, std::string> bad[] = {
      {"weight=0", "f:1: weight: expected an integer from 1 to 1000, got '0'"},
      {"weight=1001", "f:1: weight: expected an integer from 1 to 1000, got '1001'"},
      {"weight=2.5", "f:1: weight: expected an integer from 1 to 1000, got '2.5'"},
      {"rate=-1", "f:1: rate: expected a number above 0"},
      {"token_rate=x", "f:1: token_rate: expected a number above 0"},
      {"color=red", "f:1: unknown field 'color=red'"},
      {"weight", "f:1: unknown field 'weight'"},
      {"weight=2 weight=3", "f:1: weight: given twice"},
  };
  for (const auto& [fields, message] : bad) {
    auto refused = TokenAuthenticator::Parse(a + " alice * " + fields + "\n", "f");
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << fields;
    EXPECT_THAT(refused.status().message(), HasSubstr(message)) << fields;
  }
}

}  // namespace
}  // namespace attention
