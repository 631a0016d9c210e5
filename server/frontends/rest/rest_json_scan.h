// File: server/frontends/rest/rest_json_scan.h
//
// JsonReader's (rest_json_reader.h) lexical pieces: whitespace, tokens
// (numbers and literals), strings and keys, each checked and stepped over
// in place. Each Scan* function takes the text and a position at the item's
// first byte, moves the position past it and returns nullptr, or returns
// what is wrong (a static string) with the position unspecified.
//
// Stateless functions; thread-safe.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_JSON_SCAN_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_JSON_SCAN_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace attention::server::json_scan {

// JSON's whitespace.
inline bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Whether a number or literal ending at s[pos] ends there: whitespace, a
// delimiter or the end follows.
inline bool EndsToken(absl::string_view s, size_t pos) {
  return pos == s.size() || IsSpace(s[pos]) || s[pos] == ',' || s[pos] == ']' || s[pos] == '}';
}

// The bytes a number or literal is made of (a token ends at any other).
struct TokenBytes {
  bool in[256] = {};
  constexpr TokenBytes() {
    for (int c = 0; c < 256; ++c) {
      in[c] = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              c == '-' || c == '+' || c == '.';
    }
  }
};
inline constexpr TokenBytes kTokenBytes;

// The end of the number or literal at s[pos] (unchecked).
inline size_t TokenEnd(absl::string_view s, size_t pos) {
  while (pos < s.size() && kTokenBytes.in[static_cast<unsigned char>(s[pos])]) ++pos;
  return pos;
}

// The string whose opening quote is at s[*pos]: escapes, control
// characters and UTF-8 checked; unescaped into `out` when given.
const char* ScanString(absl::string_view s, size_t* pos, std::string* out);

// A number (JSON's grammar; an integer within 64 bits, a double within its
// range, see rest_json_reader.h) or a literal (true, false, null, NaN,
// Infinity, -Infinity).
const char* ScanToken(absl::string_view s, size_t* pos);

// An object's key: a string, or NaN, Infinity or -Infinity.
const char* ScanKey(absl::string_view s, size_t* pos);

}  // namespace attention::server::json_scan

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_JSON_SCAN_H_
