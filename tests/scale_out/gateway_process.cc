#include "tests/scale_out/gateway_process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/fixture/server_test_util.h"

namespace attention::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// `reference` with its replica lines (those starting `server_prefix` in the
// block opened by the line containing `block`) replaced by `servers`, the
// line containing `listen` by `listen_line`, and each overridden directive's
// line by "<directive> <value><terminator>". "" on success, else what was
// not found.
std::string Rewrite(const std::string& reference, const std::string& block,
                    const std::string& server_prefix, const std::string& servers,
                    const std::string& listen, const std::string& listen_line,
                    const std::map<std::string, std::string>& overrides,
                    const std::string& terminator, std::string* out) {
  std::istringstream lines(reference);
  std::string line;
  bool in_block = false, servers_written = false, listened = false;
  std::map<std::string, bool> overridden;
  while (std::getline(lines, line)) {
    const std::string trimmed(absl::StripLeadingAsciiWhitespace(line));
    if (absl::StrContains(line, block)) in_block = true;
    if (in_block && (trimmed == "}" || (trimmed.empty() && servers_written))) in_block = false;
    if (in_block && absl::StartsWith(trimmed, server_prefix)) {
      if (!servers_written) *out += servers;
      servers_written = true;
      continue;
    }
    if (absl::StrContains(line, listen)) {
      *out += listen_line + "\n";
      listened = true;
      continue;
    }
    bool replaced = false;
    for (const auto& [directive, value] : overrides) {
      if (absl::StartsWith(trimmed, directive + " ")) {
        *out += absl::StrCat("    ", directive, " ", value, terminator, "\n");
        overridden[directive] = replaced = true;
      }
    }
    if (!replaced) *out += line + "\n";
  }
  if (!servers_written) return "its replica lines ('" + server_prefix + "...')";
  if (!listened) return "its listen line ('" + listen + "')";
  for (const auto& [directive, value] : overrides) {
    if (!overridden[directive]) return "the directive '" + directive + "'";
  }
  return "";
}

}  // namespace

std::string GatewayProcess::Binary(Kind kind) {
  const std::string path = kind == Kind::kNginx ? "/usr/sbin/nginx" : "/usr/sbin/haproxy";
  return access(path.c_str(), X_OK) == 0 ? path : "";
}

GatewayProcess::GatewayProcess(Kind kind, const std::vector<std::string>& backends,
                               const std::map<std::string, std::string>& overrides)
    : kind_(kind), overrides_(overrides) {
  const std::string binary = Binary(kind);
  if (binary.empty()) {
    error_ = "not installed (scripts/install_deps.sh installs nginx and haproxy)";
    return;
  }
  std::string dir_template = ::testing::TempDir() + "/gateway_XXXXXX";
  if (mkdtemp(dir_template.data()) == nullptr) {
    error_ = "cannot create its folder";
    return;
  }
  dir_ = dir_template;
  chmod(dir_.c_str(), 0755);  // nginx's workers run as nobody when the test is root.
  port_ = FreePort();
  status_port_ = FreePort();
  log_ = dir_ + "/gateway.log";
  if (!WriteConfig(backends)) return;
  std::vector<std::string> args;
  if (kind_ == Kind::kNginx) {
    args = {binary, "-p", dir_, "-c", config_, "-e", log_, "-g", "daemon off;"};
  } else {
    args = {binary, "-W", "-db", "-f", config_};  // Master and worker, in the foreground.
  }
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  ok_ = AwaitGeneration();
}

GatewayProcess::~GatewayProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);  // Both stop at once (nginx: fast shutdown; HAProxy: hard stop).
    waitpid(pid_, nullptr, 0);
  }
}

std::string GatewayProcess::target() const { return "127.0.0.1:" + std::to_string(port_); }

std::string GatewayProcess::Log() const { return ReadAll(log_); }

bool GatewayProcess::WriteConfig(const std::vector<std::string>& backends) {
  const bool nginx = kind_ == Kind::kNginx;
  const std::string reference =
      ReadAll(std::string(ATTENTION_REPO_DIR) +
              (nginx ? "/deploy/nginx/attention.conf" : "/deploy/haproxy/attention.cfg"));
  std::string servers, body;
  for (size_t i = 0; i < backends.size(); ++i) {
    absl::StrAppend(
        &servers, nginx
                      ? absl::StrCat("    server ", backends[i], " max_fails=1 fail_timeout=10s;\n")
                      : absl::StrCat("    server replica", i, " ", backends[i], "\n"));
  }
  const std::string listen = absl::StrCat("127.0.0.1:", port_);
  const std::string missing =
      nginx ? Rewrite(reference, "upstream attention_replicas", "server ", servers,
                      "listen 50051 http2;", absl::StrCat("    listen ", listen, " http2;"),
                      overrides_, ";", &body)
            : Rewrite(reference, "backend attention_replicas", "server ", servers,
                      "bind :50051 proto h2", absl::StrCat("    bind ", listen, " proto h2"),
                      overrides_, "", &body);
  if (!missing.empty()) {
    error_ = "the reference configuration has no " + missing;
    return false;
  }
  std::string config;
  if (nginx) {
    const std::string temp = absl::StrCat(dir_, "/temp");
    config = absl::StrCat(
        "pid ", dir_, "/nginx.pid;\nerror_log ", log_, " notice;\nworker_processes 1;\n",
        "events { worker_connections 1024; }\nhttp {\n  access_log off;\n",
        // An old worker waits this long for a client to close after its
        // GOAWAY (default 5 s) before it exits; reloads wait for that.
        "  lingering_timeout 100ms;\n", "  client_body_temp_path ", temp,
        "_body;\n  proxy_temp_path ", temp, "_proxy;\n", "  fastcgi_temp_path ", temp,
        "_fastcgi;\n  uwsgi_temp_path ", temp, "_uwsgi;\n", "  scgi_temp_path ", temp, "_scgi;\n",
        "  server {\n    listen 127.0.0.1:", status_port_,
        ";\n    location = /generation { return 200 \"", generation_, "\"; }\n  }\n", body, "}\n");
  } else {
    config = absl::StrCat(body, "\nfrontend status\n    bind 127.0.0.1:", status_port_,
                          "\n    http-request return status 200 content-type text/plain string \"",
                          generation_, "\"\n");
    config = absl::StrCat("global\n    pidfile ", dir_, "/haproxy.pid\n",
                          config.substr(config.find("global\n") + 7));
  }
  config_ = absl::StrCat(dir_, nginx ? "/nginx.conf" : "/haproxy.cfg");
  std::ofstream(config_, std::ios::trunc) << config;
  return true;
}

bool GatewayProcess::AwaitGeneration() {
  const std::string want = std::to_string(generation_);
  for (const absl::Time until = absl::Now() + absl::Seconds(30); absl::Now() < until;) {
    if (HttpGet(status_port_, "/generation") == want) return true;
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      error_ = "exited: " + Log();
      return false;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  error_ = "configuration " + want + " did not take effect within 30 s: " + Log();
  return false;
}

int GatewayProcess::Workers() const {
  int workers = 0;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid_, "/task"))) {
    std::istringstream children(ReadAll(task.path().string() + "/children"));
    for (std::string child; children >> child;) ++workers;
  }
  return workers;
}

bool GatewayProcess::Reload(const std::vector<std::string>& backends) {
  if (pid_ <= 0) return false;
  ++generation_;
  if (!WriteConfig(backends)) return false;
  kill(pid_, kind_ == Kind::kNginx ? SIGHUP : SIGUSR2);
  if (!AwaitGeneration()) return false;
  // The old worker serves its open connections until it has closed them
  // (GOAWAY; clients reconnect to the new one); until it exits, a client
  // may still be routed by the old replica list.
  for (const absl::Time until = absl::Now() + absl::Seconds(30); absl::Now() < until;) {
    if (Workers() == 1) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  error_ = "the old worker did not exit within 30 s of the reload: " + Log();
  return false;
}

}  // namespace attention::testing
