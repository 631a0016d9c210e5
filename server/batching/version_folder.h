// File: server/batching/version_folder.h
//
// The layout of one model directory in a repository, as Triton and
// TF Serving lay it out: numbered version folders (<model>/1/, <model>/2/,
// each with config.json and model.safetensors), or today's flat layout
// (config.json and model.safetensors directly in <model>/), which is
// version 1. In the versioned layout an optional <model>/config.json holds
// the model's version policy, and only that:
//
//   {"version_policy": {"latest": 2}}     // the newest 2 (default: latest 1)
//   {"version_policy": "all"}
//   {"version_policy": {"specific": [1, 3]}}
//
// Entries whose names start with "." (and so a Kubernetes projected
// volume's "..data" symlink and the "..<timestamp>" folders it swaps
// between) or end with ".tmp", ".part", ".partial" or "~" (being written:
// rename into place when complete) are ignored, and so is any version folder
// whose name is not a positive decimal number. Symlinked folders are
// followed.
//
// Plain functions over the file system; thread-compatible.
#ifndef ATTENTION_SERVER_BATCHING_VERSION_FOLDER_H_
#define ATTENTION_SERVER_BATCHING_VERSION_FOLDER_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace attention::server {

// How the repository changes while serving (--model_control).
enum class ModelControl { kNone, kPoll, kExplicit };

// "none", "poll", "explicit"; InvalidArgument otherwise.
absl::StatusOr<ModelControl> ParseModelControl(const std::string& text);
const char* ModelControlName(ModelControl control);

// Which versions of a model serve (Triton's ModelVersionPolicy).
struct VersionPolicy {
  enum class Kind { kLatest, kAll, kSpecific };
  Kind kind = Kind::kLatest;
  int64_t latest = 1;          // kLatest: how many of the newest.
  std::set<int64_t> specific;  // kSpecific: exactly these.

  // "latest 1", "all" or "specific [1, 3]".
  std::string ToString() const;
};

struct ModelLayout {
  bool flat = false;  // config.json and model.safetensors in the model folder.
  VersionPolicy policy;
  std::map<int64_t, std::string> versions;  // Version number -> its folder.
};

// The versions found in `model_dir` and its policy. NotFound when the folder
// holds neither layout; InvalidArgument naming the file for a bad policy.
absl::StatusOr<ModelLayout> ScanModel(const std::string& model_dir);

// The model folders of `repository` (name -> path): every folder (or
// symlink to one) not ignored as above that holds config.json or a numbered
// version folder.
absl::StatusOr<std::map<std::string, std::string>> ScanRepository(const std::string& repository);

// Of `available` (loadable versions, ascending), those `policy` serves.
std::set<int64_t> SelectVersions(const VersionPolicy& policy,
                                 const std::vector<int64_t>& available);

// OK when `version_dir` is complete: config.json is there and
// model.safetensors's size is exactly 8 + its header's length + the end of
// its last tensor's data. FailedPrecondition naming the file and the sizes
// otherwise (a file being copied, a truncated file).
absl::Status CheckComplete(const std::string& version_dir);

// A fingerprint of the folder's files (names, sizes, modification times):
// equal across two polls means nobody is writing into it.
std::string Fingerprint(const std::string& version_dir);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_BATCHING_VERSION_FOLDER_H_
