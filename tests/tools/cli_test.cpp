// The hetflow command as a user types it: help, list, describe, and their --json forms.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;

TEST(Cli, HelpListsCommands) {
  const auto r = run_hetflow("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("describe"), std::string::npos);
  EXPECT_NE(r.out.find("--json"), std::string::npos);
  EXPECT_EQ(run_hetflow("describe --help").status, 0);
}

TEST(Cli, DescribeDefaultsPrintsTables) {
  const auto r = run_hetflow("describe");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("cluster mixed-academic"), std::string::npos);
  EXPECT_NE(r.out.find("network gpt2-xl"), std::string::npos);
  EXPECT_NE(r.out.find("link classes"), std::string::npos);
}

TEST(Cli, DescribeJsonIsOneObjectWithUnits) {
  const auto r = run_hetflow("describe --cluster dgx-a100-x4 --model gpt3-175b --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["cluster"]["devices"], 32);
  EXPECT_DOUBLE_EQ(j["cluster"]["peak_fp16_flops_per_s"].get<double>(), 32 * 312e12);
  EXPECT_NEAR(j["network"]["params"].get<double>() / 175e9, 1.0, 0.01);
  EXPECT_DOUBLE_EQ(j["network"]["weights_grads_adam_bytes"].get<double>(),
                   16 * j["network"]["params"].get<double>());
}

TEST(Cli, ListJsonNamesEveryPreset) {
  const auto r = run_hetflow("list --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["clusters"].size(), 6u);  // five GPU clusters and cpu-4, the example of cpu-N
  EXPECT_EQ(j["clusters"][4]["name"], "cpu-4");
  EXPECT_GE(j["gpus"].size(), 17u);
  EXPECT_EQ(j["default_cluster"], "mixed-academic");
}

TEST(Cli, VersionSaysWhichBuildThisIs) {
  for (const char* ask : {"--version", "version"}) {
    const auto r = run_hetflow(ask);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out.rfind("hetflow 0.", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("plan format 2"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("SimGrid 3."), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("CUDA "), std::string::npos) << r.out;
  }
}
