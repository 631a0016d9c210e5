#include "proto/codec/routing_key.h"

#include <set>

#include "gtest/gtest.h"

namespace attention::wire {
namespace {

TEST(RoutingKeyTest, KeysAreOneTo64SafeCharacters) {
  EXPECT_TRUE(CheckRoutingKey("a").ok());
  EXPECT_TRUE(CheckRoutingKey("AZaz09_-").ok());
  EXPECT_TRUE(CheckRoutingKey(std::string(64, 'k')).ok());
  const absl::Status empty = CheckRoutingKey("");
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.message(), "x-attention-session: expected 1 to 64 characters, got 0");
  EXPECT_EQ(CheckRoutingKey(std::string(65, 'k')).message(),
            "x-attention-session: expected 1 to 64 characters, got 65");
  // '.' and '@' separate the key from the id's digits and its address.
  for (const char* bad : {"a.b", "a@b", "a b", "é", "a/b"}) {
    const absl::Status status = CheckRoutingKey(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("expected only A-Z a-z 0-9 '_' '-'"), std::string::npos)
        << status.message();
  }
}

TEST(RoutingKeyTest, SessionIdsCarryTheirKey) {
  const std::string hex(32, 'f');
  EXPECT_EQ(SessionIdOf(hex, "", ""), hex);
  EXPECT_EQ(SessionIdOf(hex, "k-1", ""), hex + ".k-1");
  EXPECT_EQ(SessionIdOf(hex, "k-1", "10.0.0.1:50051"), hex + ".k-1@10.0.0.1:50051");
  EXPECT_EQ(RoutingKeyOf(hex + ".k-1@10.0.0.1:50051"), "k-1");
  EXPECT_EQ(RoutingKeyOf(hex + ".k-1"), "k-1");
  // No key: none found, even when the address has dots.
  EXPECT_EQ(RoutingKeyOf(hex + "@10.0.0.1:50051"), "");
  EXPECT_EQ(RoutingKeyOf(hex), "");
  EXPECT_EQ(RoutingKeyOf(""), "");
}

TEST(RoutingKeyTest, NewKeysAre32HexDigitsAndDiffer) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string key = NewRoutingKey();
    EXPECT_EQ(key.size(), 32u);
    EXPECT_TRUE(CheckRoutingKey(key).ok()) << key;
    EXPECT_EQ(key.find_first_not_of("0123456789abcdef"), std::string::npos) << key;
    seen.insert(key);
  }
  EXPECT_EQ(seen.size(), 100u);
}

}  // namespace
}  // namespace attention::wire
