#include "server/batching/version_folder.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace attention::server {
namespace fs = std::filesystem;
namespace {

constexpr char kConfig[] = "config.json";
constexpr char kWeights[] = "model.safetensors";

// Hidden (".x", and so a projected volume's "..data" and "..2026_..." swap
// folders) or temporary ("x.tmp", "x.part", "x.partial", "x~"): being written.
bool Ignored(const std::string& name) {
  if (name.empty() || name[0] == '.' || name.back() == '~') return true;
  for (const char* suffix : {".tmp", ".part", ".partial"}) {
    const size_t n = std::strlen(suffix);
    if (name.size() > n && name.compare(name.size() - n, n, suffix) == 0) return true;
  }
  return false;
}

// A positive decimal version number, or 0.
int64_t VersionOf(const std::string& name) {
  int64_t v = 0;
  if (name.empty() || name[0] == '0' || !std::all_of(name.begin(), name.end(), ::isdigit) ||
      !absl::SimpleAtoi(name, &v)) {
    return 0;
  }
  return v;
}

absl::StatusOr<VersionPolicy> ParsePolicy(const fs::path& file) {
  VersionPolicy policy;
  std::ifstream in(file);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const std::string what = file.string();
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a JSON object"));
  }
  for (const auto& [key, unused] : j.items()) {
    if (key != "version_policy") {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a versioned model's config.json holds only 'version_policy', got '",
                       key, "' (model settings go in each version's config.json)"));
    }
  }
  if (!j.contains("version_policy")) return policy;
  const nlohmann::json& p = j["version_policy"];
  if (p == "all") {
    policy.kind = VersionPolicy::Kind::kAll;
  } else if (p.is_object() && p.size() == 1 && p.contains("latest") &&
             p["latest"].is_number_integer() && p["latest"].get<int64_t>() >= 1) {
    policy.latest = p["latest"].get<int64_t>();
  } else if (p.is_object() && p.size() == 1 && p.contains("specific") && p["specific"].is_array()) {
    policy.kind = VersionPolicy::Kind::kSpecific;
    for (const auto& v : p["specific"]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": version_policy.specific: expected positive integers, got ", v.dump()));
      }
      policy.specific.insert(v.get<int64_t>());
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ": version_policy: expected {\"latest\": N >= 1}, \"all\" or "
                     "{\"specific\": [versions]}, got ",
                     p.dump()));
  }
  return policy;
}

// A versioned model's config.json: one that names a version_policy.
bool IsPolicyFile(const fs::path& file) {
  std::ifstream in(file);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return !j.is_discarded() && j.is_object() && j.contains("version_policy");
}

}  // namespace

std::string VersionPolicy::ToString() const {
  switch (kind) {
    case Kind::kLatest:
      return absl::StrCat("latest ", latest);
    case Kind::kAll:
      return "all";
    case Kind::kSpecific:
      return absl::StrCat("specific [", absl::StrJoin(specific, ", "), "]");
  }
  return "";
}

absl::StatusOr<std::vector<DirEntry>> ListDirectory(const std::string& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) {
      return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
    }
    return absl::UnavailableError(absl::StrCat(dir, ": cannot list: ", ec.message()));
  }
  std::vector<DirEntry> out;
  // Incremented with an error_code: a range-for's ++ throws on a failure.
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    DirEntry e;
    e.name = it->path().filename().string();
    e.path = it->path().string();
    struct stat st;
    e.symlink = lstat(e.path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
    if (stat(e.path.c_str(), &st) != 0) {
      const int err = errno;
      if (err == ENOENT) continue;  // Gone since listed, or a dangling symlink.
      e.type = DirEntry::Type::kUnreadable;
      e.error = std::strerror(err);
    } else if (S_ISDIR(st.st_mode)) {
      e.type = DirEntry::Type::kDirectory;
    } else if (S_ISREG(st.st_mode)) {
      e.type = DirEntry::Type::kFile;
      e.size = static_cast<int64_t>(st.st_size);
      e.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    }
    out.push_back(std::move(e));
  }
  if (ec) {
    return absl::UnavailableError(absl::StrCat(dir, ": listing failed part-way: ", ec.message()));
  }
  return out;
}

absl::StatusOr<ModelLayout> ScanModel(const std::string& model_dir, const DirectoryLister& list) {
  absl::StatusOr<std::vector<DirEntry>> entries = list(model_dir);
  if (!entries.ok()) return entries.status();
  ModelLayout layout;
  bool has_config = false, has_weights = false;
  for (const DirEntry& e : *entries) {
    if (Ignored(e.name)) continue;
    const int64_t v = VersionOf(e.name);
    if (e.type == DirEntry::Type::kUnreadable && (v > 0 || e.name == kConfig)) {
      return absl::UnavailableError(absl::StrCat(e.path, ": cannot be examined: ", e.error));
    }
    if (e.name == kConfig) has_config = e.type == DirEntry::Type::kFile;
    if (e.name == kWeights) has_weights = true;
    if (v > 0 && e.type == DirEntry::Type::kDirectory) layout.versions[v] = e.path;
  }
  const fs::path config = fs::path(model_dir) / kConfig;
  if (layout.versions.empty()) {
    if (!has_config) {
      return absl::NotFoundError(absl::StrCat(
          model_dir,
          ": no model (config.json and model.safetensors, or numbered version folders)"));
    }
    if (!has_weights && IsPolicyFile(config)) {
      // A versioned model's policy file and no version left (not a flat
      // model: that one has its weights beside its config).
      return absl::NotFoundError(
          absl::StrCat(model_dir, ": no version folder left (only its config.json)"));
    }
    layout.flat = true;
    layout.versions[1] = model_dir;
    return layout;
  }
  if (has_config) {
    absl::StatusOr<VersionPolicy> policy = ParsePolicy(config);
    if (!policy.ok()) return policy.status();
    layout.policy = *policy;
  }
  return layout;
}

absl::StatusOr<std::map<std::string, std::string>> ScanRepository(const std::string& repository,
                                                                  const DirectoryLister& list) {
  absl::StatusOr<std::vector<DirEntry>> entries = list(repository);
  if (!entries.ok()) {
    return absl::Status(entries.status().code(),
                        absl::StrCat("model repository '", repository,
                                     "' cannot be listed: ", entries.status().message()));
  }
  std::map<std::string, std::string> models;
  for (const DirEntry& e : *entries) {
    if (Ignored(e.name)) continue;
    if (e.type == DirEntry::Type::kDirectory &&
        ScanModel(e.path, list).status().code() == absl::StatusCode::kNotFound) {
      continue;
    }
    if (e.type == DirEntry::Type::kDirectory || e.type == DirEntry::Type::kUnreadable) {
      models[e.name] = e.path;
    }
  }
  return models;
}

std::set<int64_t> SelectVersions(const VersionPolicy& policy,
                                 const std::vector<int64_t>& available) {
  std::set<int64_t> out;
  switch (policy.kind) {
    case VersionPolicy::Kind::kAll:
      out.insert(available.begin(), available.end());
      break;
    case VersionPolicy::Kind::kSpecific:
      for (int64_t v : available) {
        if (policy.specific.count(v)) out.insert(v);
      }
      break;
    case VersionPolicy::Kind::kLatest:
      for (auto it = available.rbegin();
           it != available.rend() && static_cast<int64_t>(out.size()) < policy.latest; ++it) {
        out.insert(*it);
      }
      break;
  }
  return out;
}

absl::Status CheckComplete(const std::string& version_dir) {
  std::error_code ec;
  const fs::path weights = fs::path(version_dir) / kWeights;
  const bool has_config = fs::exists(fs::path(version_dir) / kConfig, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(version_dir, "/", kConfig, ": ", ec.message()));
  }
  if (!has_config) {
    return absl::FailedPreconditionError(absl::StrCat(version_dir, ": no config.json"));
  }
  const uintmax_t size = fs::file_size(weights, ec);
  if (ec == std::errc::no_such_file_or_directory) {
    return absl::FailedPreconditionError(absl::StrCat(weights.string(), ": ", ec.message()));
  }
  if (ec) return absl::UnavailableError(absl::StrCat(weights.string(), ": ", ec.message()));
  std::ifstream in(weights, std::ios::binary);
  unsigned char len_bytes[8] = {};
  if (size < 8) {
    return absl::FailedPreconditionError(absl::StrCat(
        weights.string(), ": ", size, " bytes, shorter than its 8-byte header length"));
  }
  if (!in.read(reinterpret_cast<char*>(len_bytes), 8)) {
    return absl::UnavailableError(absl::StrCat(weights.string(), ": cannot read its header"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > size - 8) {
    return absl::FailedPreconditionError(
        absl::StrCat(weights.string(), ": header of ", header_len, " bytes in a file of ", size));
  }
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len))) {
    return absl::UnavailableError(absl::StrCat(weights.string(), ": cannot read its header"));
  }
  nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::FailedPreconditionError(
        absl::StrCat(weights.string(), ": header is not a JSON object"));
  }
  uint64_t data_end = 0;
  for (const auto& [name, t] : j.items()) {
    if (name == "__metadata__") continue;
    if (!t.is_object() || !t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2 || !t["data_offsets"][1].is_number_unsigned()) {
      return absl::FailedPreconditionError(
          absl::StrCat(weights.string(), ": tensor '", name, "' has no data_offsets [begin, end]"));
    }
    data_end = std::max(data_end, t["data_offsets"][1].get<uint64_t>());
  }
  const uint64_t expected = 8 + header_len + data_end;
  if (expected != size) {
    return absl::FailedPreconditionError(absl::StrCat(
        weights.string(), ": ", size, " bytes, its header says ", expected,
        size < expected ? " (incomplete: still being copied, or truncated)" : " (trailing bytes)"));
  }
  return absl::OkStatus();
}

namespace {

absl::Status FingerprintLines(const std::string& dir, const DirectoryLister& list,
                              std::vector<std::string>* lines) {
  absl::StatusOr<std::vector<DirEntry>> entries = list(dir);
  if (!entries.ok()) return entries.status();
  for (const DirEntry& e : *entries) {
    switch (e.type) {
      case DirEntry::Type::kFile:
        lines->push_back(absl::StrCat(e.path, ":", e.size, ":", e.mtime_ns));
        break;
      case DirEntry::Type::kDirectory: {
        if (e.symlink) break;  // Not followed (a link to a parent would never end).
        const absl::Status sub = FingerprintLines(e.path, list, lines);
        if (!sub.ok()) return sub;
        break;
      }
      case DirEntry::Type::kUnreadable:
        return absl::UnavailableError(absl::StrCat(e.path, ": cannot be examined: ", e.error));
      case DirEntry::Type::kOther:
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> Fingerprint(const std::string& version_dir,
                                        const DirectoryLister& list) {
  std::vector<std::string> lines;
  const absl::Status status = FingerprintLines(version_dir, list, &lines);
  if (!status.ok()) return status;
  std::sort(lines.begin(), lines.end());
  return absl::StrJoin(lines, "\n");
}

absl::StatusOr<ModelControl> ParseModelControl(const std::string& text) {
  if (text == "none") return ModelControl::kNone;
  if (text == "poll") return ModelControl::kPoll;
  if (text == "explicit") return ModelControl::kExplicit;
  return absl::InvalidArgumentError(
      absl::StrCat("--model_control: expected none, poll or explicit, got '", text, "'"));
}

const char* ModelControlName(ModelControl control) {
  switch (control) {
    case ModelControl::kNone:
      return "none";
    case ModelControl::kPoll:
      return "poll";
    case ModelControl::kExplicit:
      return "explicit";
  }
  return "?";
}

}  // namespace attention::server
