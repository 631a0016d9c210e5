#include "core/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace attention {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // As the reference implementation.

absl::StatusOr<DType> DTypeFromSafeTensors(const std::string& name, const std::string& tensor) {
  if (name == "F32") return DType::kFloat32;
  if (name == "BF16") return DType::kBFloat16;
  if (name == "F16") return DType::kFloat16;
  if (name == "BOOL") return DType::kBool;
  return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", tensor,
                                                 "' has unsupported dtype '", name,
                                                 "': expected F32, BF16, F16 or BOOL"));
}

const char* DTypeToSafeTensors(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat16:
      return "F16";
    case DType::kBool:
      return "BOOL";
  }
  return "?";
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

absl::StatusOr<Entry> ParseEntry(const std::string& name, const nlohmann::json& j) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", name, "': ", what));
  };
  if (!j.is_object()) return bad("header entry is not an object");
  if (!j.contains("dtype") || !j["dtype"].is_string()) return bad("missing string 'dtype'");
  if (!j.contains("shape") || !j["shape"].is_array()) return bad("missing array 'shape'");
  if (!j.contains("data_offsets") || !j["data_offsets"].is_array() ||
      j["data_offsets"].size() != 2) {
    return bad("missing 'data_offsets' [begin, end]");
  }
  Entry e;
  e.name = name;
  auto dtype = DTypeFromSafeTensors(j["dtype"].get<std::string>(), name);
  if (!dtype.ok()) return dtype.status();
  e.dtype = *dtype;
  for (const auto& d : j["shape"]) {
    if (!d.is_number_unsigned()) return bad("shape entries must be non-negative integers");
    if (d.get<uint64_t>() > static_cast<uint64_t>(kMaxDim)) {
      return bad(
          absl::StrCat("shape entry ", d.get<uint64_t>(), " exceeds the limit of ", kMaxDim));
    }
    e.shape.push_back(d.get<int64_t>());
  }
  for (const auto& o : j["data_offsets"]) {
    if (!o.is_number_unsigned()) return bad("data_offsets must be non-negative integers");
  }
  e.begin = j["data_offsets"][0].get<uint64_t>();
  e.end = j["data_offsets"][1].get<uint64_t>();
  if (e.end < e.begin) {
    return bad(absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] end before begin"));
  }
  const std::optional<int64_t> elements =
      CheckedProduct(e.shape, std::numeric_limits<int64_t>::max() / 8);
  if (!elements) {
    return bad(absl::StrCat("shape ", ShapeToString(e.shape), " has too many elements"));
  }
  const uint64_t expected = static_cast<uint64_t>(*elements) * DTypeSize(e.dtype);
  if (e.end - e.begin != expected) {
    return bad(absl::StrCat("shape ", ShapeToString(e.shape), " of ", j["dtype"].get<std::string>(),
                            " needs ", expected, " bytes but data_offsets [", e.begin, ", ", e.end,
                            "] span ", e.end - e.begin));
  }
  return e;
}

}  // namespace

absl::StatusOr<SafeTensors> SafeTensors::Parse(absl::string_view bytes) {
  return ResourceExhaustedOnBadAlloc("safetensors", [&]() -> absl::StatusOr<SafeTensors> {
    if (bytes.size() < 8) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: file is truncated: ", bytes.size(), " bytes, need at least 8"));
    }
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = header_len << 8 | static_cast<uint8_t>(bytes[i]);
    if (header_len > kMaxHeaderBytes) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: header length ", header_len,
                                                     " exceeds the limit of ", kMaxHeaderBytes));
    }
    if (header_len > bytes.size() - 8) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: file is truncated: header needs ", header_len,
                       " bytes but only ", bytes.size() - 8, " follow the length"));
    }
    nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len), nullptr,
                                                  /*allow_exceptions=*/false);
    if (header.is_discarded() || !header.is_object()) {
      return absl::InvalidArgumentError("safetensors: header is not a JSON object");
    }
    const absl::string_view data = bytes.substr(8 + header_len);

    SafeTensors st;
    std::vector<Entry> entries;
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it.value().is_object()) {
          return absl::InvalidArgumentError("safetensors: __metadata__ is not an object");
        }
        for (auto m = it.value().begin(); m != it.value().end(); ++m) {
          if (!m.value().is_string()) {
            return absl::InvalidArgumentError(
                absl::StrCat("safetensors: __metadata__ value '", m.key(), "' is not a string"));
          }
          st.metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      auto entry = ParseEntry(it.key(), it.value());
      if (!entry.ok()) return entry.status();
      entries.push_back(std::move(*entry));
    }

    std::sort(entries.begin(), entries.end(),
              [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
    uint64_t covered = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      const Entry& e = entries[i];
      if (e.end > data.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "safetensors: tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end,
            "] are out of range: the data section has ", data.size(), " bytes (file truncated?)"));
      }
      if (i > 0 && e.begin < entries[i - 1].end) {
        return absl::InvalidArgumentError(
            absl::StrCat("safetensors: tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end,
                         "] overlap tensor '", entries[i - 1].name, "' [", entries[i - 1].begin,
                         ", ", entries[i - 1].end, "]"));
      }
      if (e.begin != covered) {
        return absl::InvalidArgumentError(
            absl::StrCat("safetensors: tensor '", e.name, "' starts at byte ", e.begin,
                         " leaving unreferenced bytes from ", covered));
      }
      covered = e.end;
      st.tensors_.emplace(e.name, Tensor::FromBytes(e.dtype, e.shape, data.data() + e.begin));
    }
    if (covered != data.size()) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: data section has ", data.size(),
                                                     " bytes but tensors cover only ", covered));
    }
    return st;
  });
}

absl::StatusOr<SafeTensors> SafeTensors::ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open safetensors file '", path, "'"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto st = Parse(buffer.str());
  if (!st.ok()) {
    return absl::Status(st.status().code(), absl::StrCat(path, ": ", st.status().message()));
  }
  return st;
}

const Tensor* SafeTensors::Find(absl::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafeTensors::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, unused] : tensors_) names.push_back(name);
  return names;
}

std::string WriteSafeTensors(const std::map<std::string, const Tensor*>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", DTypeToSafeTensors(t->dtype())},
                    {"shape", t->shape()},
                    {"data_offsets", {offset, offset + t->num_bytes()}}};
    offset += t->num_bytes();
  }
  std::string json = header.dump();
  while ((json.size() + 8) % 8 != 0) json.push_back(' ');
  std::string out(8, '\0');
  uint64_t len = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  out += json;
  for (const auto& [name, t] : tensors) {
    out.append(static_cast<const char*>(t->data()), t->num_bytes());
  }
  return out;
}

}  // namespace attention
