#include "core/primitive_cache.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::testing::StatusIs;
using ::testing::HasSubstr;
using dt = dnnl::memory::data_type;

std::function<dnnl::matmul::primitive_desc()> Matmul(int64_t m) {
  return [m] {
    dnnl::memory::desc a({m, 4}, dt::f32, dnnl::memory::format_tag::ab);
    dnnl::memory::desc b({4, 4}, dt::f32, dnnl::memory::format_tag::ab);
    dnnl::memory::desc c({m, 4}, dt::f32, dnnl::memory::format_tag::ab);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, CpuEngine());
  };
}

TEST(PrimitiveCacheTest, CachesAndEvictsLeastRecentlyUsed) {
  PrimitiveCache cache(2);
  auto a = cache.GetOrCreate<dnnl::matmul, dnnl::matmul::primitive_desc>("a", Matmul(1));
  ASSERT_TRUE(a.ok()) << a.status();
  auto a2 = cache.GetOrCreate<dnnl::matmul, dnnl::matmul::primitive_desc>("a", Matmul(1));
  EXPECT_EQ(a->get(), a2->get());
  EXPECT_EQ(cache.hits(), 1u);
  ASSERT_TRUE((cache.GetOrCreate<dnnl::matmul, dnnl::matmul::primitive_desc>("b", Matmul(2))).ok());
  ASSERT_TRUE((cache.GetOrCreate<dnnl::matmul, dnnl::matmul::primitive_desc>("c", Matmul(3))).ok());
  EXPECT_EQ(cache.size(), 2u);
  // "a" was least recently used: it is gone, and asking again creates it anew.
  auto a3 = cache.GetOrCreate<dnnl::matmul, dnnl::matmul::primitive_desc>("a", Matmul(1));
  ASSERT_TRUE(a3.ok());
  EXPECT_NE(a->get(), a3->get());
  EXPECT_EQ(cache.misses(), 4u);
}

TEST(PrimitiveCacheTest, ExecutesWithItsOwnScratchpad) {
  PrimitiveCache cache(4);
  auto p = cache.GetOrCreate<dnnl::matmul, dnnl::matmul::primitive_desc>("m", Matmul(2));
  ASSERT_TRUE(p.ok());
  float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[16] = {}, c[8] = {};
  for (int i = 0; i < 4; ++i) b[i * 4 + i] = 2.0f;  // 2 * identity.
  dnnl::memory::desc a_md({2, 4}, dt::f32, dnnl::memory::format_tag::ab);
  dnnl::memory::desc b_md({4, 4}, dt::f32, dnnl::memory::format_tag::ab);
  ASSERT_TRUE(Execute(**p, {{DNNL_ARG_SRC, Wrap(a_md, a)},
                            {DNNL_ARG_WEIGHTS, Wrap(b_md, b)},
                            {DNNL_ARG_DST, Wrap(a_md, c)}})
                  .ok());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c[i], 2.0f * a[i]);
}

TEST(PrimitiveCacheTest, CreationFailureIsInternalNotAnException) {
  PrimitiveCache cache(4);
  auto bad = cache.GetOrCreate<dnnl::matmul, dnnl::matmul::primitive_desc>("bad", [] {
    dnnl::memory::desc a({2, 4}, dt::f32, dnnl::memory::format_tag::ab);
    dnnl::memory::desc b({5, 4}, dt::f32, dnnl::memory::format_tag::ab);  // K mismatch.
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, a), CpuEngine());
  });
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInternal, HasSubstr("oneDNN could not create")));
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace attention
