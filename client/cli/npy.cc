#include "client/cli/npy.h"

#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/checked_math.h"

namespace attention::client {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

// The value of 'key' in the header dict, up to the next top-level comma.
std::string DictValue(const std::string& header, const std::string& key) {
  const size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) return "";
  size_t v = header.find(':', k);
  if (v == std::string::npos) return "";
  ++v;
  int depth = 0;
  size_t end = v;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if ((c == ',' && depth == 0) || (c == '}' && depth == 0)) break;
  }
  return std::string(absl::StripAsciiWhitespace(header.substr(v, end - v)));
}

}  // namespace

absl::StatusOr<Tensor> ParseNpy(const std::string& bytes, const std::string& name) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a supported .npy file: ", why));
  };
  if (bytes.size() < 10 || bytes.compare(0, 6, kMagic, 6) != 0) return bad("bad magic");
  const int major = static_cast<uint8_t>(bytes[6]);
  size_t header_len, offset;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8;
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("truncated header");
    header_len = 0;
    for (int i = 3; i >= 0; --i) header_len = header_len << 8 | static_cast<uint8_t>(bytes[8 + i]);
    offset = 12;
  } else {
    return bad(absl::StrCat("format version ", major));
  }
  if (bytes.size() < offset + header_len) return bad("truncated header");
  const std::string header = bytes.substr(offset, header_len);
  const std::string descr = DictValue(header, "descr");
  const std::string fortran = DictValue(header, "fortran_order");
  std::string shape_text = DictValue(header, "shape");
  if (fortran != "False") return bad("Fortran order (save with np.ascontiguousarray)");
  DType dtype;
  bool from_f64 = false;
  if (descr == "'<f4'") {
    dtype = DType::kFloat32;
  } else if (descr == "'<f2'") {
    dtype = DType::kFloat16;
  } else if (descr == "'|b1'") {
    dtype = DType::kBool;
  } else if (descr == "'<u2'") {
    dtype = DType::kBFloat16;
  } else if (descr == "'<f8'") {
    dtype = DType::kFloat32;
    from_f64 = true;
  } else {
    return bad(absl::StrCat("dtype ", descr, " (expected <f4, <f2, |b1, <u2 for bfloat16, <f8)"));
  }
  Shape shape;
  shape_text = std::string(absl::StripSuffix(absl::StripPrefix(shape_text, "("), ")"));
  for (absl::string_view part : absl::StrSplit(shape_text, ',', absl::SkipWhitespace())) {
    int64_t d;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &d) || d < 0) {
      return bad(absl::StrCat("shape (", shape_text, ")"));
    }
    shape.push_back(d);
  }
  const int64_t elem = from_f64 ? 8 : static_cast<int64_t>(DTypeSize(dtype));
  const std::optional<int64_t> elements =
      CheckedProduct(shape, std::numeric_limits<int64_t>::max() / elem);
  if (!elements) return bad(absl::StrCat("shape (", shape_text, ") is too large"));
  const size_t need = static_cast<size_t>(*elements * elem);
  const size_t data = offset + header_len;
  if (bytes.size() - data < need) {
    return bad(absl::StrCat("data has ", bytes.size() - data, " bytes, shape needs ", need));
  }
  if (!from_f64) return Tensor::FromBytes(dtype, shape, bytes.data() + data);
  Tensor t(DType::kFloat32, shape);
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    double v;
    std::memcpy(&v, bytes.data() + data + i * 8, 8);
    t.mutable_as<float>()[i] = static_cast<float>(v);
  }
  return t;
}

absl::StatusOr<Tensor> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseNpy(buffer.str(), path);
}

std::string SerializeNpy(const Tensor& t) {
  const char* descr = t.dtype() == DType::kFloat32    ? "<f4"
                      : t.dtype() == DType::kFloat16  ? "<f2"
                      : t.dtype() == DType::kBFloat16 ? "<u2"
                                                      : "|b1";
  std::string shape = absl::StrJoin(t.shape(), ", ");
  if (t.rank() == 1) shape += ",";
  std::string header =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", shape, "), }");
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out(kMagic, 6);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  out.append(static_cast<const char*>(t.data()), t.num_bytes());
  return out;
}

absl::Status WriteNpy(const std::string& path, const Tensor& t) {
  std::ofstream out(path, std::ios::binary);
  const std::string bytes = SerializeNpy(t);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace attention::client
