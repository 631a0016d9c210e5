#include "server/metrics/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace attention::server {
namespace {

prometheus::MetricFamily Family(const std::string& name, const std::string& help,
                                prometheus::MetricType type, double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

// Fields of /proc/self/stat after the command name (field 3 onwards), so
// that fields[0] is field 3 (state).
std::vector<std::string> StatFields() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');  // The command name may hold spaces.
  std::vector<std::string> fields;
  if (close == std::string::npos) return fields;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  while (rest >> field) fields.push_back(field);
  return fields;
}

double BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  std::string key;
  double value = 0;
  while (in >> key) {
    if (key == "btime") {
      in >> value;
      return value;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

int OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int count = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // Not the descriptor opendir itself holds.
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessMetrics::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  const std::vector<std::string> f = StatFields();
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  // Field numbers as proc(5) counts them; f[i] is field i + 3.
  auto field = [&](int number) { return std::stod(f[static_cast<size_t>(number - 3)]); };
  if (f.size() >= 22) {
    out.push_back(Family("process_cpu_seconds_total",
                         "Total user and system CPU time spent in seconds.", MetricType::Counter,
                         (field(14) + field(15)) / ticks));
    out.push_back(Family("process_threads", "Number of OS threads in the process.",
                         MetricType::Gauge, field(20)));
    out.push_back(Family("process_start_time_seconds",
                         "Start time of the process since unix epoch in seconds.",
                         MetricType::Gauge, BootTimeSeconds() + field(22) / ticks));
    out.push_back(Family("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                         MetricType::Gauge, field(23)));
    out.push_back(Family("process_resident_memory_bytes", "Resident memory size in bytes.",
                         MetricType::Gauge, field(24) * page));
  }
  const int fds = OpenFds();
  if (fds >= 0) {
    out.push_back(
        Family("process_open_fds", "Number of open file descriptors.", MetricType::Gauge, fds));
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    out.push_back(Family("process_max_fds", "Maximum number of open file descriptors.",
                         MetricType::Gauge, static_cast<double>(limit.rlim_cur)));
  }
  return out;
}

}  // namespace attention::server
