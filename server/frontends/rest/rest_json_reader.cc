#include "server/frontends/rest/rest_json_reader.h"

#include "server/frontends/rest/rest_json_scan.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace attention::server {

using json_scan::EndsToken;
using json_scan::IsSpace;
using json_scan::ScanKey;
using json_scan::ScanString;
using json_scan::ScanToken;
using json_scan::TokenEnd;

absl::Status JsonReader::Validate(absl::string_view s, int max_depth, bool non_finite) {
  std::string open;  // '{' or '[' for each container open.
  size_t pos = 0;
  const char* error = nullptr;
  const auto space = [&] {
    while (pos < s.size() && IsSpace(s[pos])) ++pos;
  };
  // NaN, Infinity or -Infinity at pos, when they are refused.
  const auto refused = [&] {
    return !non_finite && pos < s.size() &&
           (s[pos] == 'N' || s[pos] == 'I' || s.substr(pos, 2) == "-I");
  };
  // After '{' or ',' in an object: a key and its colon.
  const auto key = [&]() -> const char* {
    space();
    if (refused()) return "NaN or Infinity (not JSON)";
    if (const char* e = ScanKey(s, &pos)) return e;
    space();
    if (pos == s.size() || s[pos] != ':') return "a key without ':'";
    ++pos;
    return nullptr;
  };
  bool want_value = true;
  while (error == nullptr) {
    space();
    if (want_value) {
      if (pos == s.size()) {
        error = "the end where a value was expected";
        break;
      }
      const char c = s[pos];
      want_value = false;
      if (c == '{' || c == '[') {
        if (static_cast<int>(open.size()) >= max_depth) {
          error = "arrays and objects nested too deep";
          break;
        }
        open.push_back(c);
        ++pos;
        space();
        if (pos < s.size() && s[pos] == (c == '{' ? '}' : ']')) {
          open.pop_back();
          ++pos;
        } else {
          want_value = true;
          if (c == '{') error = key();
        }
      } else if (c == '"') {
        error = ScanString(s, &pos, nullptr);
      } else {
        error = refused() ? "NaN or Infinity (not JSON)" : ScanToken(s, &pos);
      }
      continue;
    }
    if (open.empty()) {
      if (pos != s.size()) error = "text after the value";
      break;
    }
    if (pos == s.size()) {
      error = "the end inside an array or object";
      break;
    }
    const bool object = open.back() == '{';
    if (s[pos] == (object ? '}' : ']')) {
      open.pop_back();
      ++pos;
    } else if (s[pos] == ',') {
      ++pos;
      want_value = true;
      if (object) error = key();
    } else {
      error =
          object ? "a member not followed by ',' or '}'" : "an element not followed by ',' or ']'";
    }
  }
  if (error == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(error, " at byte ", pos));
}

const char* JsonReader::KindName(Kind kind) {
  switch (kind) {
    case Kind::kObject:
      return "an object";
    case Kind::kArray:
      return "an array";
    case Kind::kString:
      return "a string";
    case Kind::kInteger:
    case Kind::kUnsigned:
      return "an integer";
    case Kind::kDouble:
      return "a number";
    case Kind::kBool:
      return "a boolean";
    case Kind::kNull:
      return "null";
  }
  return "a value";
}

void JsonReader::SkipSpace() {
  while (pos_ < json_.size() && IsSpace(json_[pos_])) ++pos_;
}

absl::string_view JsonReader::Token() {
  SkipSpace();
  const size_t start = pos_;
  pos_ = TokenEnd(json_, pos_);
  return json_.substr(start, pos_ - start);
}

bool JsonReader::AtArray() {
  SkipSpace();
  return pos_ < json_.size() && json_[pos_] == '[';
}

bool JsonReader::NumberAsDouble(double* d) {
  SkipSpace();
  if (pos_ == json_.size()) return false;
  const char c = json_[pos_];
  if (c != '-' && (c < '0' || c > '9')) return false;
  // The token's end, and whether it is a float, in one pass.
  const char* first = json_.data() + pos_;
  const char* const stop = json_.data() + json_.size();
  const char* last = first;
  bool is_float = false;
  for (; last < stop && json_scan::kTokenBytes.in[static_cast<unsigned char>(*last)]; ++last) {
    is_float |= *last == '.' || *last == 'e' || *last == 'E';
  }
  if (last - first > 1 && first[1] == 'I') return false;  // -Infinity
  const size_t end = pos_ + static_cast<size_t>(last - first);
  if (is_float) {
    if (std::from_chars(first, last, *d).ec == std::errc::result_out_of_range) {
      *d = c == '-' ? -0.0 : 0.0;  // Validate let through only what underflows.
    }
  } else if (c == '-') {
    int64_t v = 0;
    std::from_chars(first, last, v);
    *d = static_cast<double>(v);
  } else {
    uint64_t v = 0;  // The same double as the int64 below 2^63.
    std::from_chars(first, last, v);
    *d = static_cast<double>(v);
  }
  pos_ = end;
  return true;
}

JsonReader::Kind JsonReader::Peek() {
  SkipSpace();
  if (pos_ == json_.size()) return Kind::kNull;
  switch (json_[pos_]) {
    case '{':
      return Kind::kObject;
    case '[':
      return Kind::kArray;
    case '"':
    case 'N':
    case 'I':
      return Kind::kString;
    case 't':
    case 'f':
      return Kind::kBool;
    case 'n':
      return Kind::kNull;
    default:
      break;
  }
  const size_t end = TokenEnd(json_, pos_);
  bool is_float = false;
  for (size_t k = pos_; k < end; ++k) {
    const char c = json_[k];
    if (c == 'I') return Kind::kString;  // -Infinity
    is_float |= c == '.' || c == 'e' || c == 'E';
  }
  if (is_float) return Kind::kDouble;
  if (json_[pos_] == '-') return Kind::kInteger;
  // Positive: above int64's range is kUnsigned (Validate kept it in uint64's).
  const absl::string_view digits = json_.substr(pos_, end - pos_);
  return digits.size() > 19 || (digits.size() == 19 && digits > "9223372036854775807")
             ? Kind::kUnsigned
             : Kind::kInteger;
}

void JsonReader::Skip() {
  SkipSpace();
  if (json_[pos_] == '{' || json_[pos_] == '[') {
    int depth = 0;
    do {
      const char c = json_[pos_];
      if (c == '"') {
        ScanString(json_, &pos_, nullptr);
        continue;
      }
      if (c == '{' || c == '[') ++depth;
      if (c == '}' || c == ']') --depth;
      ++pos_;
    } while (depth > 0);
  } else if (json_[pos_] == '"') {
    ScanString(json_, &pos_, nullptr);
  } else {
    pos_ = TokenEnd(json_, pos_);
  }
}

void JsonReader::Enter() {
  SkipSpace();
  ++pos_;
}

bool JsonReader::NextKey(std::string* key) {
  SkipSpace();
  if (json_[pos_] == ',') {
    ++pos_;
    SkipSpace();
  }
  if (json_[pos_] == '}') {
    ++pos_;
    return false;
  }
  key->clear();
  if (json_[pos_] == '"') {
    ScanString(json_, &pos_, key);
  } else {
    const absl::string_view t = Token();
    key->assign(t.data(), t.size());  // NaN, Infinity or -Infinity.
  }
  SkipSpace();
  ++pos_;  // ':'
  return true;
}

bool JsonReader::NextElement() {
  SkipSpace();
  if (json_[pos_] == ',') {
    ++pos_;
    return true;
  }
  if (json_[pos_] == ']') {
    ++pos_;
    return false;
  }
  return true;
}

std::string JsonReader::String() {
  SkipSpace();
  std::string out;
  if (json_[pos_] == '"') {
    ScanString(json_, &pos_, &out);
  } else {
    const absl::string_view t = Token();
    out.assign(t.data(), t.size());
  }
  return out;
}

bool JsonReader::Bool() { return Token() == "true"; }

int64_t JsonReader::Integer() {
  const absl::string_view t = Token();
  int64_t v = 0;
  std::from_chars(t.data(), t.data() + t.size(), v);
  return v;
}

uint64_t JsonReader::Unsigned() {
  const absl::string_view t = Token();
  uint64_t v = 0;
  std::from_chars(t.data(), t.data() + t.size(), v);
  return v;
}

double JsonReader::Double() {
  const absl::string_view t = Token();
  double v = 0;
  const auto [end, error] = std::from_chars(t.data(), t.data() + t.size(), v);
  // Validate let through only what underflows: zero, signed as written.
  if (error == std::errc::result_out_of_range) v = t[0] == '-' ? -0.0 : 0.0;
  return v;
}

}  // namespace attention::server
