#include "proto/codec/tensor_codec.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/codec/status_codes.h"

namespace attention::wire {
namespace {

using ::testing::HasSubstr;

v1::Tensor Float32Tensor(std::initializer_list<int64_t> shape, size_t bytes) {
  v1::Tensor t;
  t.set_dtype(v1::DATA_TYPE_FLOAT32);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::string(bytes, '\0'));
  return t;
}

TEST(TensorCodecTest, DecodedViewsBorrowTheMessageBytes) {
  v1::InferRequest request;
  *request.mutable_query() = Float32Tensor({2, 3}, 24);
  float values[6] = {1, 2, 3, 4, 5, 6};
  std::memcpy(request.mutable_query()->mutable_data()->data(), values, sizeof(values));
  auto view = DecodeTensor(request.query(), "query");
  ASSERT_TRUE(view.ok()) << view.status();
  // No copy: the view points into the message, valid while it lives.
  EXPECT_EQ(view->data, static_cast<const void*>(request.query().data().data()));
  EXPECT_EQ(view->shape, (Shape{2, 3}));
  EXPECT_EQ(view->as<float>()[5], 6.0f);
  // A copy survives the message.
  auto copy = DecodeTensorCopy(request.query(), "query");
  request.Clear();
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ(copy->as<float>()[4], 5.0f);
}

TEST(TensorCodecTest, RoundTripsEveryDType) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kBool}) {
    Tensor t(dtype, {3, 2});
    for (size_t i = 0; i < t.num_bytes(); ++i) static_cast<uint8_t*>(t.data())[i] = i % 2;
    v1::Tensor wire;
    EncodeTensor(t, &wire);
    auto back = DecodeTensorCopy(wire, "t");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->dtype(), dtype);
    EXPECT_EQ(back->shape(), t.shape());
    EXPECT_EQ(std::memcmp(back->data(), t.data(), t.num_bytes()), 0);
  }
}

TEST(TensorCodecTest, ChecksBoundsAndDTypes) {
  auto message = [](const v1::Tensor& t) {
    return std::string(DecodeTensor(t, "key").status().message());
  };
  EXPECT_THAT(message(Float32Tensor({2, 3}, 20)),
              HasSubstr("key: data has 20 bytes but shape [2, 3] of float32 needs 24"));
  EXPECT_THAT(message(Float32Tensor({2, 0}, 0)), HasSubstr("key: every dimension must be in"));
  EXPECT_THAT(message(Float32Tensor({int64_t{1} << 32, 1}, 0)),
              HasSubstr("every dimension must be in [1, 2^31]"));
  EXPECT_THAT(message(Float32Tensor({1 << 20, 1 << 20, 1 << 24}, 0)),
              HasSubstr("has more than 2^40 elements"));
  EXPECT_THAT(message(Float32Tensor({}, 0)), HasSubstr("expected 1 to 8 dimensions, got 0"));
  v1::Tensor untyped = Float32Tensor({1}, 4);
  untyped.set_dtype(v1::DATA_TYPE_UNSPECIFIED);
  EXPECT_THAT(message(untyped), HasSubstr("key: dtype must be"));
  // Absent optional tensors are nullopt, present ones are checked.
  auto absent = DecodeOptionalTensor(v1::Tensor(), "key");
  ASSERT_TRUE(absent.ok());
  EXPECT_FALSE(absent->has_value());
  EXPECT_FALSE(DecodeOptionalTensor(Float32Tensor({2}, 4), "key").ok());
}

TEST(StatusCodesTest, ConvertsCodesAndNamesThem) {
  const grpc::Status s = ToGrpcStatus(absl::ResourceExhaustedError("full"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "full");
  EXPECT_EQ(StatusCodeName(absl::StatusCode::kInvalidArgument), "INVALID_ARGUMENT");
  EXPECT_EQ(StatusCodeName(absl::StatusCode::kUnauthenticated), "UNAUTHENTICATED");
}

}  // namespace
}  // namespace attention::wire
