#include "server/frontends/rest/rest_json_scan.h"

#include <algorithm>
#include <charconv>
#include <string>

namespace attention::server::json_scan {
namespace {

int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Four hex digits at s[pos..], or -1.
int Hex4(absl::string_view s, size_t pos) {
  if (pos + 4 > s.size()) return -1;
  int v = 0;
  for (size_t i = pos; i < pos + 4; ++i) {
    const int h = Hex(s[i]);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Bytes of the UTF-8 sequence at s[pos] (a byte >= 0x80), or 0 when it is
// not one (overlong forms, surrogates and code points past U+10FFFF too).
size_t Utf8Length(absl::string_view s, size_t pos) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[pos + i]); };
  const auto cont = [&](size_t i) { return (b(i) & 0xC0) == 0x80; };
  const unsigned char c = b(0);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // The second byte's range.
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (pos + n > s.size() || b(1) < lo || b(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i) {
    if (!cont(i)) return 0;
  }
  return n;
}

bool IsNonFinite(absl::string_view token) {
  return token == "NaN" || token == "Infinity" || token == "-Infinity";
}

}  // namespace

// Reads the string whose opening quote is at s[*pos], past its closing
// quote, unescaped into `out` when given. nullptr, or what is wrong.
const char* ScanString(absl::string_view s, size_t* pos, std::string* out) {
  size_t i = *pos + 1;
  while (true) {
    // The run of plain bytes, appended at once.
    const size_t run = i;
    while (i < s.size() && s[i] != '"' && s[i] != '\\' &&
           static_cast<unsigned char>(s[i]) >= 0x20 && static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
    }
    if (out != nullptr) out->append(s.data() + run, i - run);
    if (i == s.size()) return "an unterminated string";
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"') break;
    if (c < 0x20) return "a control character in a string";
    if (c >= 0x80) {
      const size_t n = Utf8Length(s, i);
      if (n == 0) return "a string that is not UTF-8";
      if (out != nullptr) out->append(s.data() + i, n);
      i += n;
      continue;
    }
    // A backslash.
    if (i + 1 == s.size()) return "an unterminated string";
    const char e = s[i + 1];
    i += 2;
    char plain = 0;
    switch (e) {
      case '"':
      case '\\':
      case '/':
        plain = e;
        break;
      case 'b':
        plain = '\b';
        break;
      case 'f':
        plain = '\f';
        break;
      case 'n':
        plain = '\n';
        break;
      case 'r':
        plain = '\r';
        break;
      case 't':
        plain = '\t';
        break;
      case 'u': {
        int cp = Hex4(s, i);
        if (cp < 0) return "a bad \\u escape";
        i += 4;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return "a lone low surrogate";
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          const int low = i + 1 < s.size() && s[i] == '\\' && s[i + 1] == 'u' ? Hex4(s, i + 2) : -1;
          if (low < 0xDC00 || low > 0xDFFF) return "a high surrogate without its low one";
          i += 6;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        if (out != nullptr) AppendUtf8(static_cast<uint32_t>(cp), out);
        continue;
      }
      default:
        return "a bad escape in a string";
    }
    if (out != nullptr) out->push_back(plain);
  }
  *pos = i + 1;
  return nullptr;
}

// Checks the number or literal at s[*pos] and moves past it. nullptr, or
// what is wrong.
const char* ScanToken(absl::string_view s, size_t* pos) {
  size_t i = *pos;
  // A literal starts with a letter (-Infinity with "-I").
  const bool literal_start =
      i < s.size() && (s[i] == '-' ? s.substr(i, 2) == "-I" : s[i] < '0' || s[i] > '9');
  if (literal_start) {
    for (absl::string_view literal : {"true", "false", "null", "NaN", "Infinity", "-Infinity"}) {
      if (s.substr(i, literal.size()) == literal && EndsToken(s, i + literal.size())) {
        *pos = i + literal.size();
        return nullptr;
      }
    }
  }
  const auto digit = [&](size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '9'; };
  const size_t start = i;
  const bool negative = i < s.size() && s[i] == '-';
  if (negative) ++i;
  if (!digit(i)) return "an unexpected character";
  if (s[i] == '0') {
    ++i;
  } else {
    while (digit(i)) ++i;
  }
  bool is_float = false;
  if (i < s.size() && s[i] == '.') {
    is_float = true;
    ++i;
    if (!digit(i)) return "a number with no digit after its point";
    while (digit(i)) ++i;
  }
  bool has_exponent = false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    is_float = has_exponent = true;
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digit(i)) return "a number with no digit in its exponent";
    while (digit(i)) ++i;
  }
  if (!EndsToken(s, i)) return "a malformed number";
  const absl::string_view number = s.substr(start, i - start);
  // A double without an exponent overflows only past 308 digits; an integer
  // of up to 18 digits fits.
  if (is_float && (has_exponent || number.size() > 300)) {
    double d = 0;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), d);
    if (error == std::errc::result_out_of_range) {
      // Too small reads as zero (as simdjson reads it); too large is refused.
      // lead: the power of ten of the first significant digit, before the exponent.
      const size_t e = std::min(number.find_first_of("eE"), number.size());
      const size_t first = number.substr(0, e).find_first_of("123456789");
      if (first != absl::string_view::npos) {
        const size_t int_end = std::min(number.find('.'), e);
        const int64_t lead = first < int_end ? static_cast<int64_t>(int_end - first - 1)
                                             : -static_cast<int64_t>(first - int_end);
        int64_t exponent = 0;
        for (size_t k = e + 1; k < number.size(); ++k) {
          if (number[k] >= '0' && number[k] <= '9' && exponent < 1000000) {
            exponent = exponent * 10 + (number[k] - '0');
          }
        }
        if (e + 1 < number.size() && number[e + 1] == '-') exponent = -exponent;
        if (lead + exponent > 0) return "a number too large for a double";
      }
    } else if (error != std::errc() || end != number.data() + number.size()) {
      return "a malformed number";
    }
  } else if (!is_float && number.size() > 18) {
    uint64_t v = 0;
    const absl::string_view digits = number.substr(negative ? 1 : 0);
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (error != std::errc() || (negative && v > uint64_t{1} << 63)) {
      return "an integer out of the 64-bit range";
    }
  }
  *pos = i;
  return nullptr;
}

// Validate's key: a string, or a NaN-like token (as a key, read as a string).
const char* ScanKey(absl::string_view s, size_t* pos) {
  if (*pos < s.size() && s[*pos] == '"') return ScanString(s, pos, nullptr);
  size_t end = *pos;
  while (!EndsToken(s, end) && s[end] != ':') ++end;
  if (!IsNonFinite(s.substr(*pos, end - *pos))) return "an object key that is not a string";
  *pos = end;
  return nullptr;
}

}  // namespace attention::server::json_scan
