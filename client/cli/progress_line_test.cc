#include "client/cli/progress_line.h"

#include <cstdio>
#include <string>

#include "client/cli/session_commands.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attention::client {
namespace {

// What `write` printed to a temporary file.
template <typename Write>
std::string Printed(Write write) {
  FILE* out = std::tmpfile();
  write(out);
  std::rewind(out);
  std::string text;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), out) != nullptr) text += buffer;
  std::fclose(out);
  return text;
}

// The first and the last always print; between them, at most one line per
// interval (an infinite one here: none).
TEST(ProgressLineTest, PrintsTheFirstAndTheLastAndLittleBetween) {
  EXPECT_EQ(Printed([](FILE* out) {
              ProgressLine line(out, "prefilled ", 4, " sessions", absl::InfiniteDuration());
              for (int i = 0; i < 4; ++i) line.Done();
              EXPECT_EQ(line.done(), 4);
            }),
            "prefilled 1/4 sessions\nprefilled 4/4 sessions\n");
  EXPECT_EQ(Printed([](FILE* out) {
              ProgressLine line(out, "decoded ", 3, " tokens", absl::ZeroDuration());
              for (int i = 0; i < 3; ++i) line.Done();
            }),
            "decoded 1/3 tokens\ndecoded 2/3 tokens\ndecoded 3/3 tokens\n");
}

TEST(ProgressLineTest, PrefillDeadlineNamesDeadlineMsAndItsValue) {
  EXPECT_THAT(PrefillDeadlineMessage(64, 4096, 10000),
              ::testing::StartsWith("prefilling 64 x 4096 tokens took longer than "
                                    "--deadline_ms=10000; raise it"));
}

}  // namespace
}  // namespace attention::client
