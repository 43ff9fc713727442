#include "model/units.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

namespace u = hetflow::model::units;

TEST(Units, ParsesBytesDecimalAndBinary) {
  EXPECT_DOUBLE_EQ(u::parse_bytes("80 GiB"), 80.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(u::parse_bytes("16 GB"), 16e9);
  EXPECT_DOUBLE_EQ(u::parse_bytes("512MiB"), 512.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(u::parse_bytes("1024 B"), 1024);
  EXPECT_DOUBLE_EQ(u::parse_bytes("8 Gb"), 1e9);  // bits
}

TEST(Units, ParsesBandwidthInBytesAndBits) {
  EXPECT_DOUBLE_EQ(u::parse_bandwidth_bytes_per_s("25 GB/s"), 25e9);
  EXPECT_DOUBLE_EQ(u::parse_bandwidth_bytes_per_s("100 Gb/s"), 12.5e9);
  EXPECT_DOUBLE_EQ(u::parse_bandwidth_bytes_per_s("56 Gbps"), 7e9);
  EXPECT_DOUBLE_EQ(u::parse_bandwidth_bytes_per_s(" 1.5e9 B/s "), 1.5e9);
}

TEST(Units, ParsesTimeAndRates) {
  EXPECT_DOUBLE_EQ(u::parse_time_s("5 us"), 5e-6);
  EXPECT_DOUBLE_EQ(u::parse_time_s("1.5 ms"), 1.5e-3);
  EXPECT_DOUBLE_EQ(u::parse_time_s("40 ms"), 0.04);
  EXPECT_DOUBLE_EQ(u::parse_time_s("200ns"), 200e-9);
  EXPECT_DOUBLE_EQ(u::parse_flops_per_s("312 TFLOP/s"), 312e12);
  EXPECT_DOUBLE_EQ(u::parse_flops_per_s("19.5 TFLOPS"), 19.5e12);
}

// A bare number is refused: "25" meant as 25 Gb/s was read as 25 bytes/s. Zero needs no unit.
TEST(Units, RefusesNumbersWithoutUnits) {
  EXPECT_THROW(u::parse_bytes("1024"), std::invalid_argument);
  EXPECT_THROW(u::parse_time_s("5"), std::invalid_argument);
  EXPECT_THROW(u::parse_bandwidth_bytes_per_s("25"), std::invalid_argument);
  EXPECT_THROW(u::parse_flops_per_s("312e12"), std::invalid_argument);
  EXPECT_EQ(u::parse_bytes("0"), 0);
  EXPECT_EQ(u::parse_time_s(" 0 "), 0);
  EXPECT_EQ(u::parse_bandwidth_bytes_per_s("0"), 0);
  EXPECT_DOUBLE_EQ(u::parse_price_usd_per_hour("2.1"), 2.1);  // a price's plain number is USD/h
  try {
    u::parse_bandwidth_bytes_per_s("25");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "expected a bandwidth such as '25 GB/s' or '100 Gb/s', found '25' without a unit (units: "
                           "B/s, kB/s, MB/s, GB/s, TB/s, GiB/s; b/s, Mb/s, Gb/s, Tb/s for bits; or Gbps)");
  }
}

TEST(Units, RejectsWhatIsNotAQuantity) {
  EXPECT_THROW(u::parse_bytes("lots"), std::invalid_argument);
  EXPECT_THROW(u::parse_bytes("3 parsecs"), std::invalid_argument);
  EXPECT_THROW(u::parse_bandwidth_bytes_per_s("25 GB"), std::invalid_argument);  // no /s
  EXPECT_THROW(u::parse_time_s("5 GB"), std::invalid_argument);
  EXPECT_THROW(u::parse_time_s(""), std::invalid_argument);
  EXPECT_THROW(u::parse_flops_per_s("inf TFLOP/s"), std::invalid_argument);
  try {
    u::parse_bandwidth_bytes_per_s("fast");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("expected a bandwidth"), std::string::npos) << e.what();
  }
}

TEST(Units, FormatReadsBackExactly) {
  for (double v : {25e9, 12.5e9, 7e9, 3.125e9, 1.0 / 3 * 1e9, 123456789.0, 0.0, 1.0}) {
    EXPECT_EQ(u::parse_bandwidth_bytes_per_s(u::format_bandwidth(v)), v) << u::format_bandwidth(v);
  }
  for (double v : {80.0 * (1 << 30), 16e9, 12345.0, 6.0 * (1 << 30), 1125899906842624.0, 2e15}) {
    EXPECT_EQ(u::parse_bytes(u::format_bytes(v)), v) << u::format_bytes(v);
  }
  for (double v : {5e-6, 2e-6, 0.04, 1e-9, 0.0, 1.0 / 7}) {
    EXPECT_EQ(u::parse_time_s(u::format_time_s(v)), v) << u::format_time_s(v);
  }
  for (double v : {312e12, 989.4e12, 15.7e12}) {
    EXPECT_EQ(u::parse_flops_per_s(u::format_flops_per_s(v)), v) << u::format_flops_per_s(v);
  }
  EXPECT_EQ(u::format_bandwidth(25e9), "25 GB/s");
  EXPECT_EQ(u::format_bytes(80.0 * (1 << 30)), "80 GiB");
  EXPECT_EQ(u::format_bytes(1125899906842624.0), "1 PiB");  // --workspace's bound, as its help says it
  EXPECT_EQ(u::human_bytes(2.0 * 1125899906842624.0), "2 PiB");
  EXPECT_EQ(u::format_time_s(5e-6), "5 us");
}

// Long durations in the unit people plan them in, never "8.08e+03 s": 1000 s on is minutes,
// then hours, then days (3.68e7 s is 3.68e7 / 86400 = 426 days).
TEST(Units, HumanTimesPastAThousandSecondsReadAsMinutesHoursDays) {
  EXPECT_EQ(u::human_time_s(999), "999 s");
  EXPECT_EQ(u::human_time_s(1000), "16.7 min");
  EXPECT_EQ(u::human_time_s(8080), "2.24 h");
  EXPECT_EQ(u::human_time_s(3.68e7), "426 days");
  EXPECT_EQ(u::human_time_s(0.951), "951 ms");
}
