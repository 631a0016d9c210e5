#include "server/memory_limit.h"

#include <unistd.h>

#include <fstream>

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

}  // namespace

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
