#include "server/requests/request_log.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attention::server {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

std::vector<std::string> Lines(const std::ostringstream& out) {
  return absl::StrSplit(out.str(), '\n', absl::SkipEmpty());
}

TEST(RequestLogTest, ALineSaysWhenWhatWhoAndWhy) {
  std::ostringstream out;
  RequestLog log(&out);
  log.Failed(Method::kAppend, "small", "alice", "ipv4:10.0.0.7:5123",
             absl::ResourceExhaustedError("response: would be about 9 bytes"));
  const auto lines = Lines(out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0],
              MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z request failed: "
                           "RESOURCE_EXHAUSTED attention.v1.SessionService/Append model=small "
                           "caller=alice peer=ipv4:10.0.0.7:5123: response: would be about 9 "
                           "bytes"));
}

TEST(RequestLogTest, UnknownsAreDashesAndControlCharactersCannotForgeLines) {
  std::ostringstream out;
  RequestLog log(&out);
  log.Failed(Method::kModelInfer, "", "", "",
             absl::NotFoundError("model: 'x\nFAKE request failed: OK' is not served"));
  const auto lines = Lines(out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("inference.GRPCInferenceService/ModelInfer model=- caller=- "
                                  "peer=-: model: 'x?FAKE"));
}

TEST(RequestLogTest, HoldsBackPastTheRateAndSaysHowMany) {
  std::ostringstream out;
  absl::Time now = absl::FromUnixSeconds(1800000000);
  RequestLog log(&out, /*lines_per_second=*/3, [&now] { return now; });
  for (int i = 0; i < 10; ++i) {
    log.Failed(Method::kInfer, "m", "-", "-", absl::UnavailableError("draining"));
  }
  EXPECT_EQ(Lines(out).size(), 3u);
  EXPECT_EQ(log.suppressed_total(), 7);
  for (const std::string& line : Lines(out)) EXPECT_THAT(line, Not(HasSubstr("more not logged")));
  now += absl::Milliseconds(1001);  // The next second's window.
  log.Failed(Method::kInfer, "m", "-", "-", absl::UnavailableError("draining"));
  const auto lines = Lines(out);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_THAT(lines[3], HasSubstr("(and 7 more not logged)"));
}

TEST(RequestLogTest, TheCallerIsNamedOnlyForLinesWritten) {
  std::ostringstream out;
  absl::Time now = absl::FromUnixSeconds(1800000000);
  RequestLog log(&out, /*lines_per_second=*/2, [&now] { return now; });
  int named = 0;
  for (int i = 0; i < 5; ++i) {
    log.Failed(
        Method::kInfer, "m",
        [&named] {
          ++named;
          return std::string("alice");
        },
        "-", absl::UnavailableError("draining"));
  }
  EXPECT_EQ(named, 2);
  EXPECT_EQ(Lines(out).size(), 2u);
}

TEST(RequestLogTest, EveryMethodHasItsPath) {
  for (int m = 0; m < kNumMethods; ++m) {
    EXPECT_NE(RequestLog::MethodPath(static_cast<Method>(m)), "unknown") << m;
  }
}

}  // namespace
}  // namespace attention::server
