// Repository load/unload and index bodies (server/frontends/rest/rest_json.h)
// are read in place, as nlohmann::json's DOM read them before, but a body
// nested deep is refused at the depth limit instead of costing ~150 times
// its bytes.
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/frontends/rest/rest_json.h"

namespace attention {
namespace {

using ::testing::HasSubstr;

// The former readers (nlohmann's DOM), as oracles.
absl::StatusOr<int> ParametersAsBefore(const std::string& body) {
  const nlohmann::json json =
      body.empty() ? nlohmann::json::object() : nlohmann::json::parse(body, nullptr, false);
  if (!json.is_object() || (json.contains("parameters") && !json["parameters"].is_object())) {
    return absl::InvalidArgumentError("request body: expected {} or {\"parameters\": {...}}");
  }
  return json.contains("parameters") ? static_cast<int>(json["parameters"].size()) : 0;
}

absl::StatusOr<bool> ReadyAsBefore(const std::string& body) {
  if (body.empty()) return false;
  const nlohmann::json json = nlohmann::json::parse(body, nullptr, false);
  if (!json.is_object() || (json.contains("ready") && !json["ready"].is_boolean())) {
    return absl::InvalidArgumentError("request body: expected {} or {\"ready\": true|false}");
  }
  return json.value("ready", false);
}

TEST(RepositoryBodyTest, ReadsEachBodyAsNlohmannDid) {
  const std::vector<std::string> bodies = {
      "",
      "{}",
      " { } ",
      R"({"parameters":{}})",
      R"({"parameters":{"config":"{\"a\":1}","file:1/model.onnx":"AAAA"}})",
      R"({"parameters":{"a":1,"a":2}})",
      R"({"parameters":{"a":1},"parameters":{}})",
      R"({"parameters":[]})",
      R"({"parameters":null})",
      R"({"parameters":{"a":NaN}})",
      R"({"x":NaN})",
      R"({"ready":true})",
      R"({"ready":false,"ready":true})",
      R"({"ready":1})",
      R"({"ready":"true"})",
      R"({"ready":true,"parameters":{"b":[[[{}]]]}})",
      R"([1])",
      "1",
      "{",
      R"({"a":[1,]})",
      "{\"a\":\"\xff\"}",
      R"({"a":"\ud800"})",
      R"({"a":1} {})",
  };
  for (const std::string& body : bodies) {
    SCOPED_TRACE(body);
    const absl::StatusOr<int> parameters = server::RepositoryControlParameters(body);
    const absl::StatusOr<int> parameters_before = ParametersAsBefore(body);
    ASSERT_EQ(parameters.ok(), parameters_before.ok()) << parameters.status();
    if (parameters.ok()) {
      EXPECT_EQ(*parameters, *parameters_before);
    } else {
      EXPECT_EQ(parameters.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(parameters.status().message(), HasSubstr(parameters_before.status().message()));
    }
    const absl::StatusOr<bool> ready = server::RepositoryIndexReady(body);
    const absl::StatusOr<bool> ready_before = ReadyAsBefore(body);
    ASSERT_EQ(ready.ok(), ready_before.ok()) << ready.status();
    if (ready.ok()) {
      EXPECT_EQ(*ready, *ready_before);
    } else {
      EXPECT_THAT(ready.status().message(), HasSubstr(ready_before.status().message()));
    }
  }
}

// /proc/self/status' `field` in bytes, or -1.
long long StatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

TEST(RepositoryBodyTest, DeepNestingIsRefusedCheaply) {
  // 2 MiB of '[' in a load body: nlohmann's DOM took ~75 MiB for it.
  std::string body = R"({"parameters":{"a":)";
  body.append(size_t{2} << 20, '[');
  body.append(size_t{2} << 20, ']');
  body.append("}}");
  const long long before = StatusBytes("VmRSS");
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    clear.flush();
    if (!clear) GTEST_SKIP() << "no /proc/self/clear_refs to reset the peak with";
  }
  const absl::StatusOr<int> parameters = server::RepositoryControlParameters(body);
  const long long rise = StatusBytes("VmHWM") - before;
  EXPECT_EQ(parameters.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parameters.status().message(),
              HasSubstr("request body: expected {} or {\"parameters\": {...}}"));
  EXPECT_LE(rise, 1 << 20);
}

}  // namespace
}  // namespace attention
