#include "client/cli/npy.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attention::client {
namespace {

using ::testing::HasSubstr;

TEST(NpyTest, RoundTripsEveryDType) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kBool}) {
    Tensor t(dtype, {2, 3});
    for (size_t i = 0; i < t.num_bytes(); ++i) static_cast<uint8_t*>(t.data())[i] = i % 2;
    auto back = ParseNpy(SerializeNpy(t), "t");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->dtype(), dtype);
    EXPECT_EQ(back->shape(), t.shape());
    EXPECT_EQ(std::string(static_cast<const char*>(back->data()), back->num_bytes()),
              std::string(static_cast<const char*>(t.data()), t.num_bytes()));
  }
  Tensor one(DType::kFloat32, {4});  // 1-D shapes are written "(4,)".
  EXPECT_THAT(SerializeNpy(one), HasSubstr("'shape': (4,)"));
  EXPECT_EQ(ParseNpy(SerializeNpy(one), "one")->shape(), (Shape{4}));
}

TEST(NpyTest, ReadsFloat64AsFloat32) {
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string bytes =
      std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header;
  const double values[2] = {1.5, -2.25};
  bytes.append(reinterpret_cast<const char*>(values), sizeof(values));
  auto t = ParseNpy(bytes, "f8");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype(), DType::kFloat32);
  EXPECT_EQ(t->as<float>()[1], -2.25f);
}

TEST(NpyTest, RejectsWhatItCannotRead) {
  EXPECT_THAT(std::string(ParseNpy("hello", "x.npy").status().message()), HasSubstr("bad magic"));
  Tensor t(DType::kFloat32, {2, 2});
  std::string bytes = SerializeNpy(t);
  EXPECT_THAT(std::string(ParseNpy(bytes.substr(0, bytes.size() - 4), "x.npy").status().message()),
              HasSubstr("data has 12 bytes, shape needs 16"));
  std::string fortran = bytes;
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_THAT(std::string(ParseNpy(fortran, "x.npy").status().message()),
              HasSubstr("Fortran order"));
  std::string i64 = bytes;
  i64.replace(i64.find("<f4"), 3, "<i8");
  EXPECT_THAT(std::string(ParseNpy(i64, "x.npy").status().message()), HasSubstr("dtype '<i8'"));
  EXPECT_EQ(ReadNpy("/nonexistent.npy").status().code(), absl::StatusCode::kNotFound);
}

TEST(NpyTest, RejectsShapesWhoseSizeOverflows) {
  // 2^62 x 4 float32 elements wrap to 0 bytes in unchecked int64 arithmetic,
  // which 16 bytes of data would pass.
  std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string bytes =
      std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header;
  bytes.append(16, '\0');
  const absl::Status status = ParseNpy(bytes, "x.npy").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("is too large"));
}

}  // namespace
}  // namespace attention::client
