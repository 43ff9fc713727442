// The reliability section: the cited defaults reproduce the fleet they come from, the
// reader takes every key and refuses bad ones at their line, and Daly's interval.
#include <gtest/gtest.h>

#include "campaign/job.hpp"
#include "campaign/reliability.hpp"
#include "model/error.hpp"

namespace hetflow::campaign {
namespace {

TEST(Reliability, DefaultsGiveLlama3sInterruptions) {
  const Reliability r = default_reliability();
  // 419 unexpected interruptions in 54 days on 16,384 GPUs in 2,048 nodes: a job MTBF of
  // 54 x 24 / 419 = 3.093 h.
  EXPECT_NEAR(1 / job_failure_rate_per_s(r, 16384, 2048) / 3600, 54.0 * 24 / 419, 1e-9);
  // Faulty GPUs, HBM3, SRAM, system processor, SDC, thermal: 268 => 79,230 h per GPU.
  EXPECT_NEAR(r.mtbf_s[0] / 3600, 16384.0 * 54 * 24 / 268, 1e-6);
  EXPECT_NEAR(failure_rates_per_s(r, 16384, 2048)[static_cast<size_t>(Component::network_switch)] * 54 * 86400, 35,
              1e-9);
}

TEST(Reliability, ReadsTheSectionAndLeavesTheRest) {
  const Reliability r = parse_reliability(R"(name: x
nodes: []
reliability:
  mtbf: {gpu: 50000 h, switch: 10 d}
  detection: 30 s
  relaunch: 2 min
  comm_setup_per_rank: 1 ms
  repair: 2.5 h
  spare_swap: 0 s
  storage_per_node: 25 GB/s
  storage_aggregate: 1 TB/s
  host_copy: 50 GB/s
  straggler: {probability: 0.001, slowdown: 1.5}
)",
                                          "c.yaml");
  EXPECT_DOUBLE_EQ(r.mtbf_s[0], 50000 * 3600.0);
  EXPECT_DOUBLE_EQ(r.mtbf_s[static_cast<size_t>(Component::network_switch)], 10 * 86400.0);
  EXPECT_DOUBLE_EQ(r.mtbf_s[1], default_reliability().mtbf_s[1]);
  EXPECT_DOUBLE_EQ(r.detection_s, 30);
  EXPECT_DOUBLE_EQ(r.relaunch_s, 120);
  EXPECT_DOUBLE_EQ(r.comm_setup_s_per_rank, 1e-3);
  EXPECT_DOUBLE_EQ(r.repair_s, 9000);
  EXPECT_DOUBLE_EQ(r.spare_swap_s, 0);
  EXPECT_DOUBLE_EQ(r.storage_node_bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(r.storage_aggregate_bytes_per_s, 1e12);
  EXPECT_DOUBLE_EQ(r.host_copy_bytes_per_s, 50e9);
  EXPECT_DOUBLE_EQ(r.straggler_probability, 0.001);
  EXPECT_DOUBLE_EQ(r.straggler_slowdown, 1.5);
  EXPECT_EQ(parse_reliability("name: x\n", "c.yaml").mtbf_s, default_reliability().mtbf_s);
}

TEST(Reliability, RefusesBadKeysAtTheirLine) {
  try {
    parse_reliability("name: x\nreliability:\n  mtbf: {gpu: 5 h}\n  detecton: 3 s\n", "c.yaml");
    FAIL() << "a misspelt key was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.line(), 4);
    EXPECT_EQ(e.field(), "reliability.detecton");
  }
  try {
    parse_reliability("name: x\nreliability:\n  mtbf: {gpu: 5 weeks}\n", "c.yaml");
    FAIL() << "a bad duration was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "reliability.mtbf.gpu");
    EXPECT_NE(std::string(e.what()).find("expected a duration"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_reliability("reliability:\n  straggler: {probability: 2}\n", "c.yaml"), InputError);
}

TEST(Reliability, DurationsInEveryUnit) {
  EXPECT_DOUBLE_EQ(parse_duration_s("90 s"), 90);
  EXPECT_DOUBLE_EQ(parse_duration_s("5min"), 300);
  EXPECT_DOUBLE_EQ(parse_duration_s("2.5 h"), 9000);
  EXPECT_DOUBLE_EQ(parse_duration_s("54d"), 54 * 86400.0);
  // A bare number is refused, as every quantity without a unit is (model/units.hpp).
  EXPECT_THROW(parse_duration_s("7"), std::invalid_argument);
  EXPECT_THROW(parse_duration_s("h"), std::invalid_argument);
  EXPECT_THROW(parse_duration_s("3 weeks"), std::invalid_argument);
}

// Daly (2006), section 5's example values: a 5-minute dump and job MTBFs of 24 h, 6 h and
// 15 min give about 117, 57 and 9.1 minutes; far from the MTBF it tends to Young's
// sqrt(2 d M); at d >= 2M the interval is M.
TEST(Daly, HigherOrderOptimum) {
  EXPECT_NEAR(daly_interval_s(300, 24 * 3600.0) / 60, 116.7, 0.05);
  EXPECT_NEAR(daly_interval_s(300, 6 * 3600.0) / 60, 56.7, 0.05);
  EXPECT_NEAR(daly_interval_s(300, 15 * 60.0) / 60, 9.14, 0.01);
  EXPECT_NEAR(daly_interval_s(1, 1e8) / std::sqrt(2 * 1e8), 1, 1e-3);
  EXPECT_DOUBLE_EQ(daly_interval_s(700, 300), 300);
}

}  // namespace
}  // namespace hetflow::campaign
