// File: server/frontends/rest/rest_json_reader.h
//
// A pull reader of JSON that builds nothing: the REST decoders walk a body's
// values in place and keep only what they use, so reading a body costs its
// bytes plus what is kept (a tensor's bytes, short strings), never a tree,
// a tape or an index of it (simdjson's DOM costs ~13 bytes per byte of
// `[0,0,...]`, its On-Demand index 4).
//
// Validate() first: it checks the whole text is one JSON value nested at
// most `max_depth` deep, in O(1) memory, so the walk that follows may assume
// well-formed input (and a syntax error is reported before any field's
// error, as a parser that reads the whole text first would). As Python's
// json module, JavaScript's writers and Triton's parser do, the tokens NaN,
// Infinity and -Infinity are taken where a value (or a key) may stand; the
// reader reads them as the strings "NaN", "Infinity", "-Infinity".
//
// Numbers are typed as simdjson types them: an integer (no '.', no
// exponent) within int64 is kInteger, above it within uint64 kUnsigned,
// larger is not valid; any other number is kDouble, correctly rounded (a
// value too large for a double is not valid; too small reads as zero).
//
// No padding is needed after the text. A JsonReader is a position in a
// string_view it does not own; not thread-safe, cheap to copy (a copy is a
// saved position).
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_JSON_READER_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_JSON_READER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attention::server {

class JsonReader {
 public:
  enum class Kind { kObject, kArray, kString, kInteger, kUnsigned, kDouble, kBool, kNull };

  // simdjson's (and so this server's former) limit.
  static constexpr int kMaxDepth = 1024;

  // OK when `json` is one JSON value (whitespace around it) nested at most
  // `max_depth` deep (and without NaN, Infinity or -Infinity unless
  // `non_finite`); else INVALID_ARGUMENT "<what> at byte <n>".
  static absl::Status Validate(absl::string_view json, int max_depth = kMaxDepth,
                               bool non_finite = true);

  // A reader at the start of `json`, which must have passed Validate().
  explicit JsonReader(absl::string_view json) : json_(json) {}

  // The next value's kind ("a string", ... for messages: KindName).
  Kind Peek();
  static const char* KindName(Kind kind);

  // Skips the next value, whatever it is.
  void Skip();

  // Objects: Enter() the next value (an object or array), then NextKey()
  // until it returns false (the closing brace, consumed); after each key,
  // read or Skip() its value. Arrays: Enter(), then NextElement() until
  // false, reading or skipping each element.
  void Enter();
  bool NextKey(std::string* key);
  bool NextElement();

  // Whether the next value is an array.
  bool AtArray();
  // When the next value is a number: reads it as a double (an integer
  // converted as static_cast<double> converts it) and returns true; else
  // false, reading nothing. The fast path of tensor data.
  bool NumberAsDouble(double* d);

  // The next value, which must be of the kind named.
  std::string String();
  bool Bool();
  int64_t Integer();
  uint64_t Unsigned();
  double Double();

 private:
  void SkipSpace();
  absl::string_view Token();  // A number's or literal's bytes.

  absl::string_view json_;
  size_t pos_ = 0;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_JSON_READER_H_
