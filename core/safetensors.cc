#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>

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

absl::StatusOr<SafeTensors::Entry> ParseEntry(const std::string& name, const nlohmann::json& j) {
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
  SafeTensors::Entry e;
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

absl::StatusOr<uint64_t> SafeTensors::HeaderLength(absl::string_view first8, uint64_t file_size) {
  if (file_size < 8 || first8.size() < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: file is truncated: ", file_size, " bytes, need at least 8"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | static_cast<uint8_t>(first8[i]);
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: header length ", header_len,
                                                   " exceeds the limit of ", kMaxHeaderBytes));
  }
  if (header_len > file_size - 8) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: file is truncated: header needs ",
                                                   header_len, " bytes but only ", file_size - 8,
                                                   " follow the length"));
  }
  return header_len;
}

absl::Status SafeTensors::ParseHeader(absl::string_view header_json, uint64_t data_size,
                                      const std::function<void(const Entry&)>& add) {
  nlohmann::json header = nlohmann::json::parse(header_json, nullptr,
                                                /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError("safetensors: header is not a JSON object");
  }
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
        metadata_[m.key()] = m.value().get<std::string>();
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
    if (e.end > data_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end,
          "] are out of range: the data section has ", data_size, " bytes (file truncated?)"));
    }
    if (i > 0 && e.begin < entries[i - 1].end) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end,
                       "] overlap tensor '", entries[i - 1].name, "' [", entries[i - 1].begin, ", ",
                       entries[i - 1].end, "]"));
    }
    if (e.begin != covered) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", e.name,
                                                     "' starts at byte ", e.begin,
                                                     " leaving unreferenced bytes from ", covered));
    }
    covered = e.end;
  }
  if (covered != data_size) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: data section has ", data_size,
                                                   " bytes but tensors cover only ", covered));
  }
  for (const Entry& e : entries) add(e);
  return absl::OkStatus();
}

absl::StatusOr<SafeTensors> SafeTensors::Parse(absl::string_view bytes) {
  return ResourceExhaustedOnBadAlloc("safetensors", [&]() -> absl::StatusOr<SafeTensors> {
    ASSIGN_OR_RETURN(const uint64_t header_len, HeaderLength(bytes.substr(0, 8), bytes.size()));
    const absl::string_view data = bytes.substr(8 + header_len);
    SafeTensors st;
    RETURN_IF_ERROR(st.ParseHeader(bytes.substr(8, header_len), data.size(), [&](const Entry& e) {
      st.tensors_.emplace(e.name, Tensor::FromBytes(e.dtype, e.shape, data.data() + e.begin));
    }));
    return st;
  });
}

namespace {

// Reads [at, at + n) of `fd` into `dst` in 16 MiB chunks, asking `abandoned`
// (may be null) before each.
absl::Status ReadAt(int fd, uint64_t at, uint64_t n, char* dst,
                    const std::function<bool()>& abandoned) {
  constexpr uint64_t kChunk = uint64_t{16} << 20;
  for (uint64_t done = 0; done < n;) {
    if (abandoned && abandoned()) return absl::CancelledError("reading was abandoned");
    const ssize_t got =
        ::pread(fd, dst + done, std::min(kChunk, n - done), static_cast<off_t>(at + done));
    if (got <= 0) return absl::DataLossError(absl::StrCat("cannot read ", n, " bytes at ", at));
    done += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

absl::Status WithPath(const std::string& path, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

}  // namespace

absl::StatusOr<std::vector<SafeTensors::Entry>> SafeTensors::OpenAndReadHeader(
    const std::string& path, const std::function<bool()>& abandoned, int* fd, uint64_t* data_start,
    SafeTensors* st) {
  *fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (*fd < 0) return absl::NotFoundError("cannot open safetensors file");
  struct stat info;
  if (::fstat(*fd, &info) != 0) return absl::DataLossError("cannot size the file");
  const uint64_t size = static_cast<uint64_t>(info.st_size);
  char first8[8] = {};
  if (size >= 8) RETURN_IF_ERROR(ReadAt(*fd, 0, 8, first8, abandoned));
  ASSIGN_OR_RETURN(const uint64_t header_len,
                   HeaderLength(absl::string_view(first8, size >= 8 ? 8 : 0), size));
  std::string header(header_len, '\0');
  RETURN_IF_ERROR(ReadAt(*fd, 8, header_len, header.data(), abandoned));
  std::vector<Entry> entries;
  RETURN_IF_ERROR(st->ParseHeader(header, size - 8 - header_len,
                                  [&](const Entry& e) { entries.push_back(e); }));
  *data_start = 8 + header_len;
  return entries;
}

absl::StatusOr<std::vector<SafeTensors::Entry>> SafeTensors::ReadEntries(const std::string& path) {
  auto entries =
      ResourceExhaustedOnBadAlloc("safetensors", [&]() -> absl::StatusOr<std::vector<Entry>> {
        int fd = -1;
        uint64_t data_start = 0;
        SafeTensors st;
        auto read = OpenAndReadHeader(path, nullptr, &fd, &data_start, &st);
        if (fd >= 0) ::close(fd);
        return read;
      });
  if (!entries.ok()) return WithPath(path, entries.status());
  return entries;
}

absl::StatusOr<SafeTensors> SafeTensors::ReadFile(const std::string& path,
                                                  const std::function<bool()>& abandoned) {
  auto st = ResourceExhaustedOnBadAlloc("safetensors", [&]() -> absl::StatusOr<SafeTensors> {
    int fd = -1;
    uint64_t data_start = 0;
    SafeTensors st;
    absl::Status status = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(const std::vector<Entry> entries,
                       OpenAndReadHeader(path, abandoned, &fd, &data_start, &st));
      // Each tensor read straight into its own storage: no copy of the file.
      for (const Entry& e : entries) {
        Tensor t = Tensor::Uninitialized(e.dtype, e.shape);
        RETURN_IF_ERROR(ReadAt(fd, data_start + e.begin, e.end - e.begin,
                               static_cast<char*>(t.data()), abandoned));
        st.tensors_.emplace(e.name, std::move(t));
      }
      return absl::OkStatus();
    }();
    if (fd >= 0) ::close(fd);
    if (!status.ok()) return status;
    return st;
  });
  if (!st.ok()) return WithPath(path, st.status());
  return st;
}

std::optional<Tensor> SafeTensors::Take(absl::string_view name) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return std::nullopt;
  std::optional<Tensor> t(std::move(it->second));
  tensors_.erase(it);
  taken_.insert(std::string(name));
  return t;
}

const Tensor* SafeTensors::Find(absl::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafeTensors::Names() const {
  std::vector<std::string> names(taken_.begin(), taken_.end());
  for (const auto& [name, unused] : tensors_) names.push_back(name);
  std::sort(names.begin(), names.end());
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
