// The REST infer response encoder (server/frontends/rest/rest_encode.h)
// sizes a response before building it: the size is exact, the output
// byte-identical to the former encoder's (tests/fuzz/rest_encode_oracle.h),
// and a response past the limit is refused without being built.
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/frontends/rest/rest_encode.h"
#include "tests/fuzz/rest_encode_oracle.h"

namespace attention {
namespace {

using ::testing::HasSubstr;

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// A response with outputs of every datatype and the floats' corner cases.
inference::ModelInferResponse Response() {
  inference::ModelInferResponse r;
  r.set_model_name("m\"\xff");
  r.set_model_version("1");
  r.set_id("id\n");
  (*r.mutable_parameters())["sequence_end"].set_bool_param(true);
  (*r.mutable_parameters())["n"].set_int64_param(-3);
  (*r.mutable_parameters())["u"].set_uint64_param(~uint64_t{0});
  (*r.mutable_parameters())["d"].set_double_param(0.1);
  (*r.mutable_parameters())["s"].set_string_param("\xc3\xa9");
  std::vector<float> f = {0.f,
                          -0.f,
                          1.f,
                          -1.17549435e-38f,
                          std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          1e7f,
                          123456.789f};
  std::mt19937 rng(3);
  for (int i = 0; i < 2000; ++i)
    f.push_back(std::ldexp(float(rng()) / 4e9f - 0.5f, int(rng() % 80) - 40));
  const auto add = [&](const std::string& name, const std::string& datatype, int64_t n,
                       std::string bytes) {
    auto* o = r.add_outputs();
    o->set_name(name);
    o->set_datatype(datatype);
    o->add_shape(1);
    o->add_shape(n);
    r.add_raw_output_contents(std::move(bytes));
  };
  add("fp32", "FP32", f.size(), Floats(f));
  std::string half(f.size() * 2, '\0'), bf(f.size() * 2, '\0'), b(f.size(), '\0');
  for (size_t i = 0; i < f.size(); ++i) {
    const uint16_t h = FloatToHalf(f[i]), g = FloatToBFloat16(f[i]);
    std::memcpy(&half[2 * i], &h, 2);
    std::memcpy(&bf[2 * i], &g, 2);
    b[i] = static_cast<char>(i % 3 == 0);
  }
  add("fp16", "FP16", f.size(), half);
  add("bf16", "BF16", f.size(), bf);
  add("bool", "BOOL", f.size(), b);
  add("empty", "FP32", 0, "");
  return r;
}

TEST(RestEncodeTest, SizesExactlyAndWritesWhatTheFormerEncoderWrote) {
  std::vector<server::RestInferRequest> asks(4);
  asks[1].all_binary = true;
  asks[2].binary_outputs = {"fp16", "empty"};
  asks[3].binary_outputs = {"empty"};  // A binary output of no bytes.
  for (const server::RestInferRequest& asked : asks) {
    SCOPED_TRACE(absl::StrCat(asked.all_binary, " ", asked.binary_outputs.size()));
    // One response for both encoders: a map's order differs between copies.
    inference::ModelInferResponse response = Response();
    const auto raw = response.raw_output_contents();
    const size_t exact = server::RestInferEncodedSize(response, asked, /*bound=*/false);
    EXPECT_GE(server::RestInferEncodedSize(response, asked, /*bound=*/true), exact);
    const server::RestBody got = server::EncodeRestInfer(response, asked);
    *response.mutable_raw_output_contents() = raw;
    const server::RestBody want = fuzz::EncodeRestInferAsBefore(response, asked);
    EXPECT_TRUE(got.bytes == want.bytes) << got.bytes.size() << " vs " << want.bytes.size();
    EXPECT_EQ(got.header_length, want.header_length);
    EXPECT_EQ(got.bytes.size(), exact);
    // Within a limit of exactly its size: the same bytes.
    *response.mutable_raw_output_contents() = raw;
    absl::StatusOr<server::RestBody> within = server::EncodeRestInferWithin(response, asked, exact);
    ASSERT_TRUE(within.ok()) << within.status().message().substr(0, 300);
    EXPECT_TRUE(within->bytes == want.bytes);
    EXPECT_EQ(within->header_length, want.header_length);
    // One byte less: refused, naming the size, as the front-end did.
    *response.mutable_raw_output_contents() = raw;
    const absl::Status status = server::EncodeRestInferWithin(response, asked, exact - 1).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(
        status.message(),
        HasSubstr(absl::StrCat("response: ", exact, " bytes", want.header_length ? "" : " as JSON",
                               ", larger than the server's limit of ", exact - 1,
                               " bytes (--max_message_bytes)")));
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

TEST(RestEncodeTest, AResponsePastTheLimitIsRefusedWithoutBeingBuilt) {
  // 8 MiB of floats as JSON (~2.7x that), against a 16 MiB limit: refused
  // by its exact size, computed without the ~22 MiB of JSON being built.
  inference::ModelInferResponse response;
  response.set_model_name("m");
  auto* o = response.add_outputs();
  o->set_name("out");
  o->set_datatype("FP32");
  o->add_shape(2 << 20);
  std::vector<float> f(2 << 20);
  std::mt19937 rng(5);
  for (float& v : f) v = float(rng()) / 3e9f;
  response.add_raw_output_contents(Floats(f));
  std::vector<float>().swap(f);
  const long long before = StatusBytes("VmRSS");
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    clear.flush();
    if (!clear) GTEST_SKIP() << "no /proc/self/clear_refs to reset the peak with";
  }
  const absl::Status status =
      server::EncodeRestInferWithin(response, server::RestInferRequest(), 16 << 20).status();
  const long long rise = StatusBytes("VmHWM") - before;
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr("as JSON, larger than the server's limit of 16777216"));
  EXPECT_LE(rise, 1 << 20);
}

}  // namespace
}  // namespace attention
