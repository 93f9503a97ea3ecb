#include <gtest/gtest.h>

#include "support/size.h"

namespace memc {
namespace {

TEST(Size, UnitsOfTheCliContract) {
  EXPECT_EQ(*parse_size("6GB"), 6'000'000'000);
  EXPECT_EQ(*parse_size("6GiB"), int64_t{6} << 30);
  EXPECT_EQ(*parse_size("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*parse_size("20MB"), 20'000'000);
  EXPECT_EQ(*parse_size("64KiB"), 65536);
  EXPECT_EQ(*parse_size("3KB"), 3000);
  EXPECT_EQ(*parse_size("123456"), 123456);
  EXPECT_EQ(*parse_size("1.5GB"), 1'500'000'000);
  EXPECT_EQ(*parse_size("4.03GB"), 4'030'000'000);  // 4029999999.9999995 in binary floating point
  EXPECT_EQ(*parse_size("1.15GB"), 1'150'000'000);
  EXPECT_EQ(*parse_size("6gb"), 6'000'000'000);
}

TEST(Size, BadSpellingsAreOneLineErrors) {
  for (const char* bad : {"", "GB", "6XB", "1.5.2GB", "0.5B", "-1GB", "99999999999TB", "6 GB", "1.0000001KB"}) {
    auto r = parse_size(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().kind(), ErrorKind::kBadInput);
    EXPECT_NE(r.status().message().find("size"), std::string::npos);
  }
}

TEST(Size, FormatsWithThreeSignificantDigits) {
  EXPECT_EQ(format_size(6'000'000'000), "6 GB");
  EXPECT_EQ(format_size(1'234'567), "1.23 MB");
  EXPECT_EQ(format_size(512), "512 B");
}

}  // namespace
}  // namespace memc
