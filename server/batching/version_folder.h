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
// A listing that fails (even part-way: a transient I/O error on a network
// volume) is an error, never a shorter list: "cannot read" must not read as
// "gone". Every scan lists folders through a DirectoryLister, which tests
// replace to inject failures.
//
// Plain functions over the file system; thread-compatible.
#ifndef ATTENTION_SERVER_BATCHING_VERSION_FOLDER_H_
#define ATTENTION_SERVER_BATCHING_VERSION_FOLDER_H_

#include <cstdint>
#include <functional>
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

// One entry of a folder, its type after following symlinks.
struct DirEntry {
  enum class Type { kDirectory, kFile, kOther, kUnreadable };
  std::string name;
  std::string path;
  Type type = Type::kOther;
  bool symlink = false;
  int64_t size = 0;      // kFile: bytes.
  int64_t mtime_ns = 0;  // kFile: modification time.
  std::string error;     // kUnreadable: why it could not be examined.
};

// Lists `dir`, one stat per entry. An entry that vanished or a dangling
// symlink is left out; one whose stat fails otherwise (a symlink loop, an
// I/O error) is kUnreadable. NotFound when `dir` does not exist or is not a
// folder; Unavailable, naming the folder and the error, when the listing
// itself fails.
absl::StatusOr<std::vector<DirEntry>> ListDirectory(const std::string& dir);

// How scans list a folder (ListDirectory; tests inject failures).
using DirectoryLister = std::function<absl::StatusOr<std::vector<DirEntry>>(const std::string&)>;

// The versions found in `model_dir` and its policy. NotFound when the folder
// is gone or holds neither layout; InvalidArgument naming the file for a bad
// policy; Unavailable when it cannot be read (a listing error, or an entry
// that may be a version or config.json that cannot be examined).
absl::StatusOr<ModelLayout> ScanModel(const std::string& model_dir,
                                      const DirectoryLister& list = ListDirectory);

// The model folders of `repository` (name -> path): every folder (or
// symlink to one) not ignored as above that holds config.json or a numbered
// version folder, and every entry not ignored that cannot be read (a model
// that cannot be read is not a model gone: ScanModel says why). NotFound or
// Unavailable (from ListDirectory) when the repository cannot be listed.
absl::StatusOr<std::map<std::string, std::string>> ScanRepository(
    const std::string& repository, const DirectoryLister& list = ListDirectory);

// Of `available` (loadable versions, ascending), those `policy` serves.
std::set<int64_t> SelectVersions(const VersionPolicy& policy,
                                 const std::vector<int64_t>& available);

// OK when `version_dir` is complete: config.json is there and
// model.safetensors's size is exactly 8 + its header's length + the end of
// its last tensor's data. FailedPrecondition naming the file and the sizes
// otherwise (a file being copied, a truncated file); Unavailable when a file
// cannot be read (an I/O error: not a verdict on the version).
absl::Status CheckComplete(const std::string& version_dir);

// A fingerprint of the folder's files (names, sizes, modification times),
// recursively: equal across two polls means nobody is writing into it.
// ListDirectory's errors (a file that cannot be examined is Unavailable).
absl::StatusOr<std::string> Fingerprint(const std::string& version_dir,
                                        const DirectoryLister& list = ListDirectory);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_BATCHING_VERSION_FOLDER_H_
