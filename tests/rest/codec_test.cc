// The REST infer decoder (server/frontends/rest/rest_codec.h) reads JSON in
// place: it decodes every body as the simdjson DOM decoder it replaced did
// (tests/fuzz/rest_codec_dom_oracle.h: same requests, same refusals), and a
// body costs the tensor it holds, not ~15 times its bytes.
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/frontends/rest/rest_codec.h"
#include "tests/fuzz/rest_codec_dom_oracle.h"

namespace attention {
namespace {

using ::testing::HasSubstr;

const std::vector<std::string>& Bodies() {
  static const std::vector<std::string> bodies = {
      R"({"inputs":[{"name":"query","datatype":"FP32","shape":[1,2,2],"data":[1,2.5,-0,-0.0]}]})",
      R"({"inputs":[{"data":[[1,2],[3,4]],"shape":[2,2],"datatype":"FP32","name":"q"}]})",
      R"({"id":"x\u00e9\ud83d\ude00","inputs":[{"name":"b","datatype":"BOOL","shape":[3],)"
      R"("data":[true,0,1]}],"outputs":[{"name":"o","parameters":{"binary_data":true}}]})",
      R"({"parameters":{"a":1,"b":-2,"c":18446744073709551615,"d":1e-400,"e":"s","f":true,)"
      R"("binary_data_output":false,"g":NaN},"inputs":[]})",
      R"({"inputs":[{"name":"m","datatype":"FP32","shape":[4],"data":[NaN,Infinity,-Infinity,"NaN"]}]})",
      R"({NaN:1,"inputs":[{"name":"q","name":"r","datatype":"FP32","shape":[1],"data":[3],"data":[4]}]})",
      R"({"inputs":[{"name":"q","datatype":"FP32","shape":[2],"data":[1e38,3.4028236e38]}]})",
      R"({"inputs":[{"name":"q","datatype":"FP32","shape":[1],"data":9007199254740993}]})",
      R"({"inputs":[{"name":"q","datatype":"FP16","shape":[1],"parameters":{"binary_data_size":2}}]}ab)",
      R"({"inputs":[{"name":"q","datatype":"FP32","shape":[1],"data":[{"a":1}]}]})",
      R"({"inputs":[{"name":"q","datatype":"FP32","shape":[2],"data":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],2]}]})",
      R"({"outputs":[5,{"name":"x","parameters":{"classification":1}}]})",
      R"({"outputs":[{"name":"x","parameters":{"binary_data":1}}],"inputs":{}})",
      R"({"inputs":[{"name":"q","datatype":"FP32","shape":[1.0],"data":[1]}]})",
      R"({"inputs":[{"name":"q","datatype":"BOOL","shape":[2],"data":[2,null]}]})",
      R"( [1,2] )",
      "{\"id\":\"\xff\"}",
      R"({"id":"\ud800"})",
      R"({"id":"\udc00"})",
      R"({"inputs":[{"name":"q","datatype":"FP32","shape":[1],"data":[1e400]}]})",
      R"({"inputs":[{"name":"q","datatype":"FP32","shape":[1],"data":[123456789012345678901]}]})",
      R"({"inputs":[{"name":"q","datatype":"FP32","shape":[1],"data":[-9223372036854775808]}]})",
      R"({"inputs":[{"name":"q","datatype":"FP32","shape":[1],"data":[01]}]})",
      R"({"a":[1,2,}],"inputs":[]})",
      R"({"inputs":[]} x)",
      "",
  };
  return bodies;
}

TEST(RestCodecTest, DecodesEachBodyAsTheDomDecoderDid) {
  int decoded = 0;
  for (const std::string& body : Bodies()) {
    SCOPED_TRACE(body);
    const std::optional<size_t> header = body.size() > 2 && body.substr(body.size() - 2) == "ab"
                                             ? std::optional<size_t>(body.size() - 2)
                                             : std::nullopt;
    const absl::Status same = fuzz::CompareWithDomOracle(body, header);
    EXPECT_TRUE(same.ok()) << same;
    decoded += server::DecodeRestInfer(body, header, "m", "").ok();
  }
  EXPECT_GE(decoded, 8);  // Not only refusals are compared.
}

TEST(RestCodecTest, DecodesMutatedBodiesAsTheDomDecoderDid) {
  // Every prefix, and every byte replaced by each of a few JSON-significant
  // bytes, of each body.
  const std::string replacements = "{}[]\",:\\0-.eE aNI\xc3";
  int cases = 0;
  for (const std::string& seed : Bodies()) {
    for (size_t i = 0; i <= seed.size(); ++i) {
      const std::string prefix = seed.substr(0, i);
      const absl::Status same = fuzz::CompareWithDomOracle(prefix, std::nullopt);
      ASSERT_TRUE(same.ok()) << same << "\n" << prefix;
      ++cases;
      if (i == seed.size()) continue;
      for (char c : replacements) {
        std::string mutated = seed;
        mutated[i] = c;
        const absl::Status same = fuzz::CompareWithDomOracle(mutated, std::nullopt);
        ASSERT_TRUE(same.ok()) << same << "\n" << mutated;
        ++cases;
      }
    }
  }
  EXPECT_GT(cases, 10000);
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

// The peak memory `decode` adds (VmHWM, reset first, over VmRSS before).
template <typename F>
long long PeakRise(F decode) {
  const long long before = StatusBytes("VmRSS");
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    clear.flush();
    if (!clear || before < 0 || StatusBytes("VmHWM") > before + (1 << 20)) return -1;
  }
  decode();
  return StatusBytes("VmHWM") - before;
}

TEST(RestCodecTest, AJsonBodyCostsItsTensorNotFifteenTimesItsBytes) {
  // [0,0,...]: 2 body bytes per 4-byte float, the worst case. The DOM
  // decoder added 15 bytes per body byte; reading in place adds the tensor.
  constexpr int kRows = 16 * 1024;
  std::string body =
      R"({"inputs":[{"name":"query","datatype":"FP32","shape":[1,16384,256],"data":[)";
  body.reserve(body.size() + kRows * 256 * 2 + 8);
  for (int i = 0; i < kRows * 256; ++i) body.append(i ? ",0" : "0");
  body.append("]}]}");
  size_t tensor = 0;
  const long long rise = PeakRise([&] {
    absl::StatusOr<server::RestInferRequest> r =
        server::DecodeRestInfer(body, std::nullopt, "m", "");
    ASSERT_TRUE(r.ok()) << r.status();
    tensor = r->request.raw_input_contents(0).size();
  });
  if (rise < 0) GTEST_SKIP() << "no /proc/self/clear_refs to reset the peak with";
  EXPECT_EQ(tensor, size_t{kRows} * 256 * 4);
  EXPECT_LE(static_cast<double>(rise) / body.size(), 4.0)
      << rise << " bytes of peak for a body of " << body.size();
}

TEST(RestCodecTest, DeepNestingIsRefusedCheaply) {
  // 8 MiB of '[' as an input's data: refused at simdjson's depth limit,
  // having allocated nothing for the rest (the DOM decoder indexed all of
  // it first: 4 bytes per '[').
  std::string body = R"({"inputs":[{"name":"query","datatype":"FP32","shape":[1],"data":)";
  body.append(size_t{8} << 20, '[');
  absl::Status status;
  const long long rise =
      PeakRise([&] { status = server::DecodeRestInfer(body, std::nullopt, "m", "").status(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(status.message(), HasSubstr("nested too deep"));
  if (rise < 0) GTEST_SKIP() << "no /proc/self/clear_refs to reset the peak with";
  EXPECT_LE(rise, 1 << 20);
}

}  // namespace
}  // namespace attention
