#include "server/batching/version_folder.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "gtest/gtest.h"

namespace attention::server {
namespace {

namespace fs = std::filesystem;

std::string Dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/version_folder_" + name + "_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A safetensors file: 8-byte length, header, `data` bytes.
std::string SafeTensors(const std::string& header, size_t data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data, '\0');
}

TEST(VersionFolderTest, SelectsByPolicy) {
  VersionPolicy latest;
  latest.latest = 2;
  EXPECT_EQ(SelectVersions(latest, {1, 2, 5}), (std::set<int64_t>{2, 5}));
  VersionPolicy all;
  all.kind = VersionPolicy::Kind::kAll;
  EXPECT_EQ(SelectVersions(all, {1, 2, 5}), (std::set<int64_t>{1, 2, 5}));
  VersionPolicy specific;
  specific.kind = VersionPolicy::Kind::kSpecific;
  specific.specific = {1, 7};
  EXPECT_EQ(SelectVersions(specific, {1, 2, 5}), (std::set<int64_t>{1}));
  EXPECT_EQ(SelectVersions(VersionPolicy{}, {}), (std::set<int64_t>{}));
}

TEST(VersionFolderTest, ScansLayoutsAndPolicies) {
  const std::string flat = Dir("flat");
  Write(flat + "/config.json", "{}");
  auto layout = ScanModel(flat);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_TRUE(layout->flat);
  EXPECT_EQ(layout->versions.size(), 1u);
  EXPECT_EQ(layout->versions.begin()->first, 1);

  const std::string versioned = Dir("versioned");
  for (const char* v : {"1", "3", "..4", ".5", "07", "x"})
    fs::create_directories(versioned + "/" + v);
  Write(versioned + "/config.json", R"({"version_policy": {"specific": [3]}})");
  layout = ScanModel(versioned);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_FALSE(layout->flat);
  ASSERT_EQ(layout->versions.size(), 2u);  // Hidden, zero-padded and named folders ignored.
  EXPECT_EQ(layout->policy.ToString(), "specific [3]");

  Write(versioned + "/config.json", R"({"version_policy": {"latest": 0}})");
  EXPECT_EQ(ScanModel(versioned).status().code(), absl::StatusCode::kInvalidArgument);
  Write(versioned + "/config.json", R"({"num_heads": 4})");
  EXPECT_EQ(ScanModel(versioned).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ScanModel(Dir("empty")).status().code(), absl::StatusCode::kNotFound);
}

TEST(VersionFolderTest, CompleteOnlyWhenSizesAgreeWithTheHeader) {
  const std::string dir = Dir("complete");
  const std::string header = R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})";
  EXPECT_EQ(CheckComplete(dir).code(), absl::StatusCode::kFailedPrecondition);  // No config.
  Write(dir + "/config.json", "{}");
  EXPECT_EQ(CheckComplete(dir).code(), absl::StatusCode::kFailedPrecondition);  // No weights.
  Write(dir + "/model.safetensors", SafeTensors(header, 10));                   // Being copied.
  const absl::Status partial = CheckComplete(dir);
  EXPECT_EQ(partial.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(partial.message().find("incomplete"), std::string::npos) << partial;
  Write(dir + "/model.safetensors", SafeTensors(header, 16));
  EXPECT_TRUE(CheckComplete(dir).ok());
  const std::string before = *Fingerprint(dir);
  Write(dir + "/model.safetensors", SafeTensors(header, 20));  // Trailing bytes.
  EXPECT_EQ(CheckComplete(dir).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(*Fingerprint(dir), before);
  Write(dir + "/model.safetensors", std::string(4, '\0'));  // Shorter than its length field.
  EXPECT_EQ(CheckComplete(dir).code(), absl::StatusCode::kFailedPrecondition);
}

// A Kubernetes projected volume (ConfigMap, Secret, downward API): the
// files live in a "..<timestamp>" folder, "..data" links to it, and each
// top-level name links through "..data"; an update writes a new timestamped
// folder and renames a new "..data" link over the old one.
TEST(VersionFolderTest, IgnoresProjectedVolumeSwapsAndTemporaryNames) {
  const std::string repo = Dir("projected");
  auto write_version = [](const std::string& dir) {
    fs::create_directories(dir);
    Write(dir + "/config.json", "{}");
  };
  write_version(repo + "/..2026_11_24_13_00_00.1/m/1");
  fs::create_directory_symlink("..2026_11_24_13_00_00.1", repo + "/..data");
  fs::create_directory_symlink("..data/m", repo + "/m");
  // Temporary and hidden names, each otherwise a model.
  for (const char* name : {"new.tmp", "copy.part", "copy.partial", "edit~", ".hidden"}) {
    fs::create_directories(repo + "/" + name);
    Write(repo + "/" + name + "/config.json", "{}");
  }
  auto models = ScanRepository(repo);
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->size(), 1u);
  EXPECT_EQ(models->begin()->first, "m");
  auto layout = ScanModel(repo + "/m");
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_FALSE(layout->flat);
  EXPECT_EQ(layout->versions.size(), 1u);

  // Versions being written under temporary names are not versions yet.
  write_version(repo + "/m/2.tmp");
  write_version(repo + "/m/..3");
  write_version(repo + "/m/4~");
  layout = ScanModel(repo + "/m");
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->versions.size(), 1u);

  // The kubelet's swap: a new timestamped folder, "..data" renamed over.
  write_version(repo + "/..2026_11_24_13_05_00.2/m/1");
  write_version(repo + "/..2026_11_24_13_05_00.2/m/2");
  fs::create_directory_symlink("..2026_11_24_13_05_00.2", repo + "/..data_tmp");
  fs::rename(repo + "/..data_tmp", repo + "/..data");
  fs::remove_all(repo + "/..2026_11_24_13_00_00.1");
  models = ScanRepository(repo);
  ASSERT_TRUE(models.ok()) << models.status();
  EXPECT_EQ(models->size(), 1u);
  layout = ScanModel(repo + "/m");
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->versions.size(), 2u);
  EXPECT_EQ(layout->versions.rbegin()->first, 2);
  EXPECT_EQ(layout->versions.rbegin()->second, repo + "/m/2");
}

// What cannot be read is an error, never a shorter listing: "cannot read"
// must not read as "gone".
TEST(VersionFolderTest, ListingErrorsAreNotAbsence) {
  const std::string repo = Dir("errors");
  EXPECT_EQ(ListDirectory(repo + "/missing").status().code(), absl::StatusCode::kNotFound);
  Write(repo + "/file", "x");
  EXPECT_EQ(ListDirectory(repo + "/file").status().code(), absl::StatusCode::kNotFound);
  fs::create_directories(repo + "/m/1");
  Write(repo + "/m/1/config.json", "{}");
  fs::create_symlink("nowhere", repo + "/m/dangling");  // Left out, as if absent.
  fs::create_symlink("loop", repo + "/m/loop");         // ELOOP: cannot be examined.
  auto entries = ListDirectory(repo + "/m");
  ASSERT_TRUE(entries.ok()) << entries.status();
  std::map<std::string, DirEntry::Type> types;
  for (const DirEntry& e : *entries) types[e.name] = e.type;
  EXPECT_EQ(types, (std::map<std::string, DirEntry::Type>{{"1", DirEntry::Type::kDirectory},
                                                          {"loop", DirEntry::Type::kUnreadable}}));
  // An unreadable entry that is not a version name is not the model's business.
  EXPECT_TRUE(ScanModel(repo + "/m").ok());
  fs::create_symlink("2", repo + "/m/2");  // A version that cannot be examined.
  EXPECT_EQ(ScanModel(repo + "/m").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Fingerprint(repo + "/m/2").status().code(), absl::StatusCode::kUnavailable);
  fs::remove(repo + "/m/2");
  // A model folder that cannot be examined stays in the repository's list.
  fs::create_symlink("p", repo + "/p");
  auto models = ScanRepository(repo);
  ASSERT_TRUE(models.ok()) << models.status();
  EXPECT_EQ(models->size(), 2u);
  EXPECT_EQ(models->count("p"), 1u);
  EXPECT_EQ(ScanModel(repo + "/p").status().code(), absl::StatusCode::kUnavailable);
  // A lister failing part-way fails the scan.
  const DirectoryLister failing = [&](const std::string& dir) {
    if (dir == repo) {
      return absl::StatusOr<std::vector<DirEntry>>(absl::UnavailableError("part-way"));
    }
    return ListDirectory(dir);
  };
  EXPECT_EQ(ScanRepository(repo, failing).status().code(), absl::StatusCode::kUnavailable);
  // A versioned model's policy file with no version left: no model.
  const std::string emptied = Dir("emptied");
  Write(emptied + "/config.json", R"({"version_policy": {"latest": 1}})");
  EXPECT_EQ(ScanModel(emptied).status().code(), absl::StatusCode::kNotFound);
}

TEST(VersionFolderTest, ParsesModelControl) {
  EXPECT_EQ(*ParseModelControl("poll"), ModelControl::kPoll);
  EXPECT_EQ(*ParseModelControl("explicit"), ModelControl::kExplicit);
  EXPECT_EQ(*ParseModelControl("none"), ModelControl::kNone);
  EXPECT_EQ(ParseModelControl("sometimes").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attention::server
