#include "server/requests/identifiers.h"

#include <string>

#include "gtest/gtest.h"

namespace attention::server {
namespace {

// True when `s` is well-formed UTF-8 (no cut or stray continuation bytes).
bool ValidUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// An id echoed or shown cut is cut between characters: a proto3 string
// holding half a character makes the client's parse of the whole message
// fail (Python's protobuf refuses invalid UTF-8).
TEST(IdentifiersTest, CutsFallBetweenUtf8Characters) {
  for (const std::string character : {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"}) {
    for (size_t lead = 0; lead < 4; ++lead) {
      std::string id(lead, 'a');
      while (id.size() < 2 * kMaxIdentifierBytes) id += character;
      const std::string echoed = Echoed(id);
      EXPECT_LE(echoed.size(), kMaxIdentifierBytes);
      EXPECT_GT(echoed.size(), kMaxIdentifierBytes - 4);
      EXPECT_TRUE(ValidUtf8(echoed)) << "lead " << lead << ", " << character.size() << "-byte";
      EXPECT_TRUE(ValidUtf8(Shown(id))) << "lead " << lead << ", " << character.size() << "-byte";
      EXPECT_EQ(id.compare(0, echoed.size(), echoed), 0);
    }
  }
  EXPECT_EQ(Echoed("short"), "short");
}

}  // namespace
}  // namespace attention::server
