#include "core/safetensors.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::testing::StatusIs;
using ::testing::HasSubstr;

// A file from a header JSON and a data section.
std::string File(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(len >> (8 * i));
  return out + header + data;
}

void ExpectInvalid(const std::string& bytes, const std::string& message) {
  EXPECT_THAT(SafeTensors::Parse(bytes),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
}

TEST(SafeTensorsTest, RoundTripsEveryDType) {
  Tensor f32(DType::kFloat32, {2, 3});
  for (int i = 0; i < 6; ++i) f32.mutable_as<float>()[i] = 0.5f * i;
  Tensor bf16 = f32.ConvertTo(DType::kBFloat16);
  Tensor f16 = f32.ConvertTo(DType::kFloat16);
  Tensor mask(DType::kBool, {3});
  mask.mutable_as<uint8_t>()[1] = 1;
  const std::string bytes =
      WriteSafeTensors({{"a", &f32}, {"b", &bf16}, {"c", &f16}, {"m", &mask}});
  auto st = SafeTensors::Parse(bytes);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_THAT(st->Names(), ::testing::ElementsAre("a", "b", "c", "m"));
  for (const char* name : {"a", "b", "c"}) {
    const Tensor* t = st->Find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->shape(), (Shape{2, 3}));
    for (int i = 0; i < 6; ++i) EXPECT_EQ(LoadAsFloat(t->dtype(), t->data(), i), 0.5f * i);
  }
  EXPECT_EQ(st->Find("m")->as<uint8_t>()[1], 1);
  EXPECT_EQ(st->Find("missing"), nullptr);
}

TEST(SafeTensorsTest, RefusesShapesWhoseSizeOverflows) {
  // Each dim within 2^31 but the product past int64: refused before any
  // multiplication can wrap.
  ExpectInvalid(File(R"({"w":{"dtype":"F32","shape":[2147483648,2147483648,2147483648],)"
                     R"("data_offsets":[0,0]}})",
                     ""),
                "tensor 'w': shape [2147483648, 2147483648, 2147483648] has too many elements");
  ExpectInvalid(
      File(R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]}})", ""),
      "tensor 'w': shape entry 18446744073709551615 exceeds the limit of 2147483648");
}

TEST(SafeTensorsTest, ReadsMetadataAndUnalignedData) {
  // Header length 61 leaves the data unaligned; the reader copies it.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  float value = 2.5f;
  std::string data(4, '\0');
  std::memcpy(data.data(), &value, 4);
  auto st = SafeTensors::Parse(File(header, data));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->metadata().at("format"), "pt");
  EXPECT_EQ(st->Find("x")->as<float>()[0], 2.5f);
}

TEST(SafeTensorsTest, RejectsTruncatedFiles) {
  ExpectInvalid("abc", "file is truncated: 3 bytes, need at least 8");
  ExpectInvalid(File("{}", "").substr(0, 9), "header needs 2 bytes but only 1 follow");
  ExpectInvalid(File(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234"),
                "tensor 'w': data_offsets [0, 8] are out of range: the data section has 4 bytes");
}

TEST(SafeTensorsTest, RejectsBadHeaders) {
  ExpectInvalid(File("not json", ""), "header is not a JSON object");
  ExpectInvalid(File("[1,2]", ""), "header is not a JSON object");
  ExpectInvalid(File(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "1234"),
                "tensor 'w': missing string 'dtype'");
  ExpectInvalid(File(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "1234"),
                "tensor 'w': shape entries must be non-negative integers");
  ExpectInvalid(File(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", "1234"),
                "tensor 'w': missing 'data_offsets'");
  ExpectInvalid(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8), "header length");
}

TEST(SafeTensorsTest, RejectsWrongDTypeAndShape) {
  ExpectInvalid(File(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", "12345678"),
                "tensor 'w' has unsupported dtype 'F64'");
  ExpectInvalid(File(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "12345678"),
                "tensor 'w': shape [3] of F32 needs 12 bytes but data_offsets [0, 8] span 8");
}

TEST(SafeTensorsTest, RejectsOverlapsAndHoles) {
  ExpectInvalid(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                     "12345678"),
                "overlap tensor 'a'");
  ExpectInvalid(File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "12345678"),
                "tensor 'a' starts at byte 4 leaving unreferenced bytes from 0");
  ExpectInvalid(File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "12345678"),
                "data section has 8 bytes but tensors cover only 4");
  ExpectInvalid(File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", "12345678"),
                "end before begin");
}

TEST(SafeTensorsTest, CorruptedFilesAreRejectedNeverCrash) {
  Tensor a(DType::kFloat32, {3, 4}), b(DType::kBFloat16, {5});
  const std::string good = WriteSafeTensors({{"a", &a}, {"b", &b}});
  std::mt19937 rng(5);
  int rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
    auto parsed = SafeTensors::Parse(bytes);  // Must return, not crash.
    if (!parsed.ok()) {
      ++rejected;
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
  EXPECT_GT(rejected, 1000);
}

TEST(SafeTensorsTest, ReadFileReportsMissingFile) {
  EXPECT_THAT(SafeTensors::ReadFile("/nonexistent/model.safetensors"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/model.safetensors")));
}

// ReadFile reads each tensor straight from the file (no copy of the whole
// file): the same tensors as Parse, the same checks, Cancelled when told to
// stop, and Take() hands a tensor over without a copy.
TEST(SafeTensorsTest, ReadFileReadsWhatParseParses) {
  Tensor a(DType::kFloat32, {4, 5});
  for (int i = 0; i < 20; ++i) a.mutable_as<float>()[i] = 0.25f * i;
  Tensor b = a.ConvertTo(DType::kBFloat16);
  const std::string path = ::testing::TempDir() + "/safetensors_read_file_test";
  const std::string bytes = WriteSafeTensors({{"a", &a}, {"b", &b}});
  std::ofstream(path, std::ios::binary) << bytes;
  auto st = SafeTensors::ReadFile(path);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_THAT(st->Names(), ::testing::ElementsAre("a", "b"));
  ASSERT_NE(st->Find("b"), nullptr);
  EXPECT_EQ(std::memcmp(st->Find("b")->data(), b.data(), b.num_bytes()), 0);
  auto entries = SafeTensors::ReadEntries(path);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].shape, (Shape{4, 5}));
  EXPECT_EQ((*entries)[1].dtype, DType::kBFloat16);

  const void* before = st->Find("a")->data();
  std::optional<Tensor> taken = st->Take("a");
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->data(), before);  // Moved, not copied.
  EXPECT_EQ(st->Find("a"), nullptr);
  EXPECT_THAT(st->Names(), ::testing::ElementsAre("a", "b"));
  EXPECT_FALSE(st->Take("a").has_value());

  int asked = 0;
  EXPECT_THAT(SafeTensors::ReadFile(path, [&] { return ++asked >= 3; }),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("abandoned")));
  EXPECT_EQ(asked, 3);  // The length, the header, then before the first tensor.
  std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() - 4);
  EXPECT_THAT(SafeTensors::ReadFile(path),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
  EXPECT_THAT(SafeTensors::ReadEntries(path),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
  std::remove(path.c_str());
  EXPECT_THAT(SafeTensors::ReadFile(path),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot open")));
}

}  // namespace
}  // namespace attention
