// Policies as a user runs them: ps and wsp with every policy.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::write_file;

TEST(SyncCli, PsAndWspSimulateWithUniformAndBalanced) {
  for (const char* policy : {"uniform", "balanced"}) {
    for (const char* sync : {"ps", "wsp"}) {
      const auto r = run_hetflow(std::string("simulate --cluster hetpipe-testbed --model resnet50 --pipeline 4 --data 2 "
                                             "--microbatches 4 --micro-batch 8 --json --policy ") +
                                 policy + " --sync " + sync);
      ASSERT_EQ(r.status, 0) << policy << " " << sync << ": " << r.err;
      EXPECT_TRUE(nlohmann::json::parse(r.out)["completed"].get<bool>()) << policy << " " << sync;
    }
  }
}
