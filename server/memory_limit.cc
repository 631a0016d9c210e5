#include "server/memory_limit.h"

#include <unistd.h>

#include <fstream>
#include <string>

namespace attention::server {
namespace {

// A cgroup limit file's value; 0 when absent, "max" or absurdly large (v1
// writes a page-rounded INT64_MAX when unlimited).
int64_t ReadLimit(const char* path) {
  std::ifstream f(path);
  std::string text;
  if (!(f >> text) || text == "max") return 0;
  try {
    const int64_t v = std::stoll(text);
    return v > 0 && v < (int64_t{1} << 60) ? v : 0;
  } catch (...) {
    return 0;
  }
}

// A "Name:   123 kB" line of /proc/self/status, in bytes.
int64_t StatusBytes(const std::string& name) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.compare(0, name.size(), name) != 0 || line.size() <= name.size() ||
        line[name.size()] != ':') {
      continue;
    }
    try {
      return std::stoll(line.substr(name.size() + 1)) * 1024;
    } catch (...) {
      return 0;
    }
  }
  return 0;
}

}  // namespace

int64_t ResidentBytes() { return StatusBytes("VmRSS"); }

int64_t PeakResidentBytes() { return StatusBytes("VmHWM"); }

int64_t MemoryLimitBytes(std::string* source) {
  const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const int64_t limit = ReadLimit(path);
    if (limit > 0 && limit < physical) {
      if (source != nullptr) *source = path;
      return limit;
    }
  }
  if (source != nullptr) *source = "physical memory";
  return physical;
}

}  // namespace attention::server
