// Policies as a user runs them: uneven cuts (--stage-layers), ps and wsp with every policy.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;

namespace {

const std::string kData = std::string(HETFLOW_SOURCE_DIR) + "/tests/tools/data/";
// 3 nodes of 4 V100-16 + 1 node of 4 T4; a 24-block GPT (26 layers).
const std::string kMixed = "--cluster " + kData + "mixed_v100_t4.yaml --model gpt:layers=24,hidden=1024,heads=16,seq=1024";

}  // namespace

TEST(StageLayersCli, UniformTakesUnevenCuts) {
  const auto r = run_hetflow("plan " + kMixed + " --pipeline 4 --data 1 --stage-layers 4,8,8,6");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* line : {"layers   0-3    on ", "layers   4-11   on ", "layers  12-19   on ", "layers  20-25   on "}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
  const auto bad = run_hetflow("plan " + kMixed + " --pipeline 4 --stage-layers 4,8,8");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("--stage-layers: expected 4 layer counts"), std::string::npos) << bad.err;
}

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
